"""A budget tree: one key's limit split across many holders.

Lives here: a child holder's link to its parent (``link``: asking for
permits and giving them back, ``parent_link``; what a round may hand out
meanwhile, ``link_ceilings``), a parent's waker of quiet children
(``children``), and the tree's rules, pure (``pure/``). The holder reaches
the link and the waker through one object, its place in the tree
(``holder/tree_place``).
"""
