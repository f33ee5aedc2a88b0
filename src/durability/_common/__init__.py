"""Small helpers every part of the library shares.

Lives here: checks of values from outside (``checks``, pure), the clock
(``clock``), the one door to ``ctx.storage`` (``sql``), schema versions
(``schema``), the error shape both wire formats share (``wire``, pure),
calls to other objects (``calls``) and listeners (``listeners``).
Must not know: any part of the library that uses them.
"""
