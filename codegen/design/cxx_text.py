"""Reading the C++ call text the lowering writes into its nodes (MVU calls as strings)."""


def split_args(text: str) -> list[str]:
    """Split a template/call argument list at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out
