"""Writes a C++ file defining ptc::kWebAssets (coordinator/web_assets.h)
with the given files' bytes: embed.py OUT.cc FILE...  (a Bazel genrule)."""
import os
import sys

TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def main():
    out, files = sys.argv[1], sys.argv[2:]
    lines = ['#include "coordinator/web_assets.h"', "", "namespace ptc {", "",
             "const WebAsset kWebAssets[] = {"]
    for f in sorted(p for p in files if not p.endswith(".py")):
        name = os.path.basename(f)
        data = open(f, "rb").read()
        # Bytes as escapes: any content, no delimiter to collide with.
        body = "".join(f"\\x{b:02x}" for b in data)
        chunks = [body[i:i + 400] for i in range(0, len(body), 400)] or [""]
        literal = "\n".join(f'        "{c}"' for c in chunks)
        lines.append(f'    {{"/{name}", "{TYPES[os.path.splitext(name)[1]]}",')
        lines.append(f"     absl::string_view(\n{literal},\n        {len(data)})}},")
    lines += ["};", f"const int kWebAssetCount = {len([p for p in files if not p.endswith('.py')])};",
              "", "}  // namespace ptc", ""]
    open(out, "w").write("\n".join(lines))


if __name__ == "__main__":
    main()
