#!/usr/bin/env bash
# Fetches NVIDIA's cuobjdump and the nvdisasm it runs (from their PyPI wheels,
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) into .tools/, so the
# SASS checks (tests: GpuCodegenOps.SassShowsTheTensorCoreInstructions; scripts/gpu_validate.sh)
# run on a machine whose CUDA toolkit lacks it. Best effort: prints why and exits 0 when it cannot
# (no network, no python3); the SASS test then skips, saying so. Safe to re-run.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=.tools
[ -x "$DEST/cuobjdump" ] && [ -x "$DEST/nvdisasm" ] && exit 0
command -v cuobjdump >/dev/null 2>&1 && exit 0
if ! command -v python3 >/dev/null 2>&1; then
  echo "get_cuda_tools.sh: no python3 to fetch cuobjdump with; the SASS test will skip"
  exit 0
fi
python3 - "$DEST" <<'PY' || echo "get_cuda_tools.sh: could not fetch cuobjdump / nvdisasm; the SASS test will skip"
import io, json, os, sys, urllib.parse, urllib.request, zipfile
dest = sys.argv[1]
for tool in ("cuobjdump", "nvdisasm"):
    index = "https://pypi.org/pypi/nvidia-cuda-%s/json" % tool
    meta = json.load(urllib.request.urlopen(index, timeout=20))
    wheel = next(u for u in meta["urls"] if u["filename"].endswith(".whl") and "x86_64" in u["filename"])
    # (A mirror may answer with URLs relative to the index.)
    data = urllib.request.urlopen(urllib.parse.urljoin(index, wheel["url"]), timeout=60).read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        name = next(n for n in z.namelist() if n.endswith("/bin/" + tool))
        os.makedirs(dest, exist_ok=True)
        path = os.path.join(dest, tool)
        with open(path + ".part", "wb") as f:
            f.write(z.read(name))
        os.chmod(path + ".part", 0o755)
        os.replace(path + ".part", path)
    print("get_cuda_tools.sh:", tool, "from", wheel["filename"], "->", dest)
PY
exit 0
