"""A subprocess that drives the NVML stand-in through the unmodified `pynvml`.

pynvml keeps one library handle per process, so every scenario gets its own probe. The
test talks to it with one JSON object per line on stdin/stdout:

    {"op": "call", "fn": "nvmlDeviceGetUUID", "args": [{"handle": 0}]}
    {"op": "exec", "code": "result = ..."}

Answers are {"ok": value} (plus "structs": [...] for struct arguments), or {"error": code,
"cls": ..., "msg": ...} when pynvml raised NVMLError, or {"exception": "..."} otherwise.
Handles returned by calls are kept here and named by their position ({"handle": i}).
Arguments {"struct": "<pynvml class>", "version": n} become a fresh struct passed by
reference (version overrides the one pynvml fills in).
"""

from __future__ import annotations

import ctypes
import json
import sys
import traceback
from typing import Any

import pynvml

handles: list[Any] = []


def to_json(value: Any) -> Any:
    if isinstance(value, ctypes.Structure):
        return {name: to_json(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [to_json(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    if isinstance(value, pynvml.c_nvmlDevice_t):
        handles.append(value)
        return {"handle": len(handles) - 1}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def decode_arg(arg: Any, structs: list[Any]) -> Any:
    if isinstance(arg, dict) and "handle" in arg:
        return handles[arg["handle"]]
    if isinstance(arg, dict) and "struct" in arg:
        s = getattr(pynvml, arg["struct"])()
        if "version" in arg:
            s.version = arg["version"]
        structs.append(s)
        return ctypes.byref(s)
    return arg


def last_error() -> str:
    lib = pynvml.nvmlLib
    buf = ctypes.create_string_buffer(1024)
    lib.nvlfabricNvmlGetLastError(buf, ctypes.c_uint(len(buf)))
    return buf.value.decode()


def handle_request(req: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    structs: list[Any] = []
    try:
        if req["op"] == "call":
            fn = getattr(pynvml, req["fn"])
            args = [decode_arg(a, structs) for a in req.get("args", [])]
            result = fn(*args)
            out: dict[str, Any] = {"ok": to_json(result)}
            if structs:
                out["structs"] = [to_json(s) for s in structs]
            return out
        if req["op"] == "exec":
            namespace.pop("result", None)
            exec(req["code"], namespace)
            return {"ok": to_json(namespace.get("result"))}
        return {"exception": f"unknown op {req['op']!r}"}
    except pynvml.NVMLError as e:
        return {"error": e.value, "cls": type(e).__name__, "msg": str(e)}
    except Exception:
        return {"exception": traceback.format_exc()}


def main() -> None:
    namespace: dict[str, Any] = {
        "pynvml": pynvml,
        "ctypes": ctypes,
        "handles": handles,
        "last_error": last_error,
        "to_json": to_json,
    }
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(handle_request(json.loads(line), namespace)), flush=True)


if __name__ == "__main__":
    main()
