"""The holder: one key's concurrency budget, inside its Durable Object.

Lives here: the object's shell (``shell``: ``DurabilitySemaphore`` and what
it does with a message, in order), when rounds run and what one commits
(``rounds``), what it answers (``replies``), what changes its books between
rounds (``between_rounds``), its books and their rows (``books``,
``store``), the line of requests it answered at once and its calls back to
their clients (``parked``, ``calls``), the user's limits and fair-share
options (``limits``, ``fair_options``), ``usage()`` (``usage``), its place
in a budget tree (``tree_place``, the one object through which it
reaches a tree's link and waker), and the rules it applies, pure
(``pure/``). Must not know: the queue's side.
"""
