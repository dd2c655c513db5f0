"""Shared by the YAML fuzz tests: every path into a nested dict/list document."""


def doc_paths(obj, prefix=()):
    """Yield the key/index path of every node of a plain YAML document (the root is ``()``)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from doc_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from doc_paths(v, prefix + (i,))
