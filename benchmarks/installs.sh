#!/usr/bin/env bash
# Clean-venv installs of mvdb from this checkout (issue #18): wall time, venv size, `pip check`, and
# a tiny database built and searched with the index backend it reports.
#   bash benchmarks/installs.sh cpu gpu plain        -> $OUT or benchmarks/results/installs-cpu.json
#   KEEP=1 keeps the venvs ($VENVS/venv-CASE, VENVS=/tmp by default); SMOKE_ONLY=1 reinstalls only
#   mvdb into kept venvs and reruns the smoke test (the install figures already recorded stay).
#   RAW (/tmp/mvdb-installs by default) keeps each case's record; the JSON lists every one there.
# Cases (the README's commands, with this checkout in place of the package name):
#   cpu    pip install "mvdb[cpu]" with the CPU torch build. The README's form takes torch from
#          download.pytorch.org/whl/cpu (--extra-index-url); this machine reaches PyPI only, and its
#          pip.conf lists /opt/wheels (torch 2.13.0+cpu): the pin "torch==2.13.*" picks that +cpu
#          wheel over PyPI's CUDA 2.13.0, the same rule (a local version sorts above the public one)
#          that makes --extra-index-url pick the +cpu build.
#   gpu    pip install "mvdb[gpu]" (PyPI's CUDA torch + faiss-gpu), then the same command again with
#          --upgrade: faiss-gpu must stay and faiss-cpu must not come.
#   plain  pip install mvdb (CPU torch as for cpu, no FAISS): the pure-torch token index.
#   local  pip install --no-deps --no-build-isolation of a copy of this checkout's package files
#          into a venv that sees this Python's packages: no download, seconds (the smoke run: the
#          script's every step; the copy keeps setuptools' build/ out of the checkout).
# Every install runs with --no-cache-dir (downloads counted) on Python 3.11.
set -uo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}  # the interpreter the venvs come from (python -m benchmarks passes its own)
RAW=${RAW:-/tmp/mvdb-installs}
mkdir -p "$RAW"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

spec() {  # the install arguments of a case
    case "$1" in
        cpu) echo "$ROOT[cpu] torch==2.13.*" ;;
        gpu) echo "$ROOT[gpu]" ;;
        plain) echo "$ROOT torch==2.13.*" ;;
        local) echo "--no-deps --no-build-isolation $RAW/src" ;;
    esac
}

smoke() {  # $1 venv: a 300-document database, one search, the backend (away from the checkout's mvdb/)
    (cd /tmp && "$1/bin/python" - <<'EOF'
import json, sys, tempfile, time
import numpy as np
import mvdb, mvdb.engine
rng = np.random.default_rng(0)
docs = [rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(5, 40, 300)]
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as d, mvdb.open(d + "/t.mvdb", device="cpu") as db:
    db.add(docs)
    hits = db.search(docs[7][:8], k=3)
    st = db.stats()
try:
    import faiss
    fv = faiss.__version__
except ImportError:
    fv = None
print(json.dumps({"ok": hits[0].id == 7, "top": [h.id for h in hits], "index": st["index"],
                  "index_backend": st.get("index_backend"), "backend": mvdb.engine.index_backend(),
                  "faiss": fv, "torch_file": sys.modules["torch"].__file__,
                  "seconds": round(time.perf_counter() - t0, 2)}))
EOF
    )
}

record() {  # $1 case $2 venv $3 seconds $4 upgrade json -> $RAW/$1.json
    local v=$2
    local size check pkgs smk
    size=$(du -sm "$v" | cut -f1)
    check=$("$v/bin/python" -m pip check 2>&1)
    pkgs=$("$v/bin/python" -m pip list --format=json 2>/dev/null)
    smk=$(smoke "$v" 2>"$RAW/$1.smoke.err" | tail -1)
    "$v/bin/python" - "$1" "$(spec "$1")" "$3" "$size" "$check" "$pkgs" "${smk:-null}" "$4" > "$RAW/$1.json" <<'EOF'
import json, sys
case, args, secs, size, check, pkgs, smk, upg = sys.argv[1:]
pk = {p["name"].lower(): p["version"] for p in json.loads(pkgs)}
keep = ["torch", "triton", "numpy", "faiss-cpu", "faiss-gpu", "h5py", "click"]
print(json.dumps({"case": case, "command": "pip install " + args, "seconds": float(secs), "venv_mb": int(size),
                  "pip_check": check.strip(), "packages": {k: pk.get(k) for k in keep},
                  "n_packages": len(pk), "nvidia_packages": sorted(k for k in pk if k.startswith("nvidia")),
                  "smoke": json.loads(smk), "upgrade": json.loads(upg)}))
EOF
    cat "$RAW/$1.json"
}

failed=0  # a case that fails is said and fails the run (after the others), never left out silently
for c in "$@"; do
    v=${VENVS:-/tmp}/venv-$c
    if [ "${SMOKE_ONLY:-0}" = 1 ]; then
        "$v/bin/python" -m pip install -q --no-deps --force-reinstall "$ROOT" >/dev/null && s=$(smoke "$v" | tail -1) && echo "$s" \
            && python3 -c "import json, sys; p = sys.argv[1]; d = json.load(open(p)); d['smoke'] = json.loads(sys.argv[2])
json.dump(d, open(p, 'w'))" "$RAW/$c.json" "$s"
        continue
    fi
    if [ "$c" = local ]; then
        # No pip of its own: the venv's bundled setuptools (no bdist_wheel) would hide this Python's.
        # It sees $PY's own packages through a .pth file, not --system-site-packages: a venv made by
        # a venv's Python would see the base interpreter's packages instead, not those of $PY.
        rm -rf "$v" "$RAW/src" && "$PY" -m venv --without-pip "$v" \
            || { echo "$c: $PY -m venv failed" >&2; failed=1; continue; }
        purelib=$("$v/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
            && "$PY" -c "import site; print('import site; ' + '; '.join(
                f'site.addsitedir({p!r})' for p in site.getsitepackages() + [site.getusersitepackages()]))" \
                > "$purelib/_parent_site.pth" \
            || { echo "$c: linking $PY's packages into the venv failed" >&2; failed=1; continue; }
        mkdir "$RAW/src" && cp -r "$ROOT"/{pyproject.toml,README.md,LICENSE,mvdb,kernels,storage} "$RAW/src/" \
            || { echo "$c: copying the checkout failed" >&2; failed=1; continue; }
    else
        rm -rf "$v" && "$PY" -m venv "$v" && "$v/bin/python" -m pip install -q --upgrade pip >/dev/null
    fi
    # shellcheck disable=SC2046
    t0=$(date +%s.%N)
    "$v/bin/python" -m pip install -q $(spec "$c") > "$RAW/$c.log" 2>&1 \
        || { echo "$c: install failed"; tail "$RAW/$c.log"; failed=1; continue; }
    secs=$(echo "$(date +%s.%N) - $t0" | bc)
    upg=null
    if [ "$c" = gpu ]; then  # the same command again, upgrading: faiss-gpu stays, faiss-cpu does not come
        t0=$(date +%s.%N)
        "$v/bin/python" -m pip install -q --upgrade $(spec "$c") >> "$RAW/$c.log" 2>&1
        u=$(echo "$(date +%s.%N) - $t0" | bc)
        upg=$("$v/bin/python" -c "
import importlib.metadata as m, json
def v(n):
    try: return m.version(n)
    except m.PackageNotFoundError: return None
print(json.dumps({'seconds': $u, 'faiss-gpu': v('faiss-gpu'), 'faiss-cpu': v('faiss-cpu')}))")
    fi
    record "$c" "$v" "$secs" "$upg"
    [ "${KEEP:-0}" = 1 ] || rm -rf "$v"
done

# every case recorded so far, one JSON file
"$PY" - "$RAW" "${OUT:-$ROOT/benchmarks/results}/installs-cpu.json" <<'EOF'
import datetime, glob, json, os, platform, sys
raw, out = sys.argv[1:]
cases = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(raw, "*.json")))]
json.dump({"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "source": "local checkout (pip install /work/main[...]); pip.conf find-links /opt/wheels",
           "cases": cases}, open(out, "w"), indent=1)
print("wrote", out)
EOF
exit $failed
