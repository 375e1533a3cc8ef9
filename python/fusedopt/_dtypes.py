"""The one dtype table of the Python package: fusedopt's dtype codes, the names that stand for
them (torch's and fusedopt's), and torch's dtype for each (looked up only where torch is)."""

# code -> the names that stand for it, torch's first (torch.<name> is its torch dtype).
DTYPES = {
    "fp32": ("float32", "fp32"),
    "fp16": ("float16", "fp16"),
    "bf16": ("bfloat16", "bf16"),
    "fp64": ("float64", "fp64"),  # params of element-wise rules, their states in float64 too
}
_BY_NAME = {name: code for code, names in DTYPES.items() for name in names}


def code_of(dtype):
    """fusedopt's code of a dtype given as a torch dtype or a name ('float32', 'bf16'), or None
    for one fusedopt does not bind."""
    return _BY_NAME.get(str(dtype).replace("torch.", ""))


def torch_dtypes():
    """{torch dtype: code} for every bound dtype (imports torch)."""
    import torch
    return {getattr(torch, names[0]): code for code, names in DTYPES.items()}


def bound_names():
    """'float32, float16 and bfloat16': the bound dtypes, for messages."""
    names = [names[0] for names in DTYPES.values()]
    return ", ".join(names[:-1]) + " and " + names[-1]
