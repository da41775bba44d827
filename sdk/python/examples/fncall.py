"""Stateless calls from Python: an fncall environment keeps warm containers, each call gets a
clean one, with files in and files out.

    python3 fncall.py --base base:default
"""

from __future__ import annotations

import argparse

import corral


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="base:default", help="a base layer (python3 for --python)")
    ap.add_argument("--name", default="py-example")
    ap.add_argument("--python", action="store_true", help="also run Python code (needs python3)")
    args = ap.parse_args()
    c = corral.Corral()
    try:
        c.fncall_env(args.name)
    except corral.NotFound:
        # warm_imports: a warm interpreter per container with these modules imported ahead.
        c.create_fncall_env(args.name, args.base, pool_min=1, pool_max=4, timeout="20s",
                            warm_imports=["json"])

    r = c.call(args.name, ["sh", "-c", "read n < in.txt; echo $((n * 2)) | tee out.txt"],
               files={"in.txt": b"21\n"}, outputs=["out.txt"])
    print("exit", r.exit_code, "stdout", r.text.strip(), "out.txt", r.outputs["out.txt"],
          "wall_ms", r.wall_ms, "container", r.container)

    for ev in c.call_stream(args.name, script="for i in 1 2 3; do echo tick $i; sleep 0.1; done"):
        if ev.type == "stdout":
            print("streamed", ev.data.decode().strip())

    if args.python:
        r = c.call(args.name, python="import json, sys; print(json.dumps({'args': sys.argv[1:]}))",
                   argv=["a", "b"])
        print("python:", r.text.strip(), "warm" if r.warm else "cold")
    c.delete_fncall_env(args.name)


if __name__ == "__main__":
    main()
