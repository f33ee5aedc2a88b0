"""durability.experimental: parts of the library whose API may still change.

Lives here: the experimental entry points, named as the specification names
them (``durability/experimental/semaphore``). What "experimental" promises:
the behaviour and the durability guarantees are those of the stable parts
and equally tested; names, signatures and options may change in a minor
release, said in the release notes, with the old names kept importable for
one release. Pin an exact version when you depend on them. Must not know:
anything of its own; it only re-exports.
"""
