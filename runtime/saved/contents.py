"""What `texelflow inspect` prints: a saved file's plan summary, variants and sizes, read and
checked like a load but without a device (nothing is built, no pipeline is created)."""

from __future__ import annotations

from collections import Counter

import numpy as np


def file_sizes(tensors: dict[str, np.ndarray], file_bytes: int) -> dict[str, int]:
    """Bytes of the file, of its constants and of its SPIR-V modules."""
    const = sum(a.nbytes for k, a in tensors.items() if k.startswith("const/"))
    spirv = sum(a.nbytes for k, a in tensors.items() if k.startswith("spirv/"))
    return {"file": file_bytes, "constants": const, "spirv": spirv}


def dispatch_variants(doc: dict) -> list[tuple[str, str]]:
    """(dispatch label, variant name) per dispatch, in order."""
    return [(d["label"], d["variant"]) for seg in doc["segments"] for d in seg["dispatches"]]


def summary(path, doc: dict, sizes: dict[str, int]) -> str:
    """The header facts, inputs and outputs, the variants used (with dispatch counts), the sizes
    (`file_sizes`) and the plan summary recorded at save."""
    counts = Counter(name for _, name in dispatch_variants(doc))

    def specs(entries):
        return ", ".join(f"{s['name']} {s['dtype']}{list(s['shape'])}" for s in entries)

    lines = [f"{path}: texelflow {doc['texelflow_version']}, saved on {doc['saved_on']}, registry "
             f"{doc['registry_hash'][:12]}",
             f"inputs:  {specs(doc['inputs'])}",
             f"outputs: {specs(doc['outputs'])}",
             f"device features needed: {', '.join(doc['features']) or 'none'}",
             f"sizes: file {sizes['file']} B, constants {sizes['constants']} B, SPIR-V {sizes['spirv']} B",
             f"{sum(counts.values())} dispatches, {len(counts)} variants:"]
    fallbacks = [f"{seg['fallback']['label']} ({seg['fallback']['target']})" for seg in doc["segments"]
                 if seg.get("fallback") is not None]
    lines += [f"  {n:5d}  {name}" for name, n in sorted(counts.items())]
    if fallbacks:
        lines.append(f"CPU fallbacks (need torch {doc.get('torch_version', '')}): {', '.join(fallbacks)}")
    if doc.get("writes"):
        lines.append(f"writes back: {', '.join(w['kind'] + ' ' + str(w['target']) for w in doc['writes'])}")
    lines += ["plan:", doc["plan_summary"]]
    return "\n".join(lines)


def inspect(path) -> str:
    """The summary of the saved program at `path`, after the same checks as a load (format,
    version, hash, schema): a damaged file gets the same one-line error."""
    from texelflow.runtime.saved.reader import read

    doc, tensors, file_bytes = read(path)
    return summary(path, doc, file_sizes(tensors, file_bytes))
