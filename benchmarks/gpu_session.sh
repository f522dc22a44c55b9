#!/usr/bin/env bash
# One call on the lent GPU machine: install this tree and the peer wheels, then run the steps named.
#   bash benchmarks/gpu_session.sh tests bench:a,b,c sweep:b storage:1000000
# Logs and JSON go to $OUT (the device tool brings them back). FAISS GPU: carry .gpu and run
#   source .gpu/env.sh && bash benchmarks/gpu_session.sh dbtests e2e:100000
# Which backend runs the token index (issue #18; "faiss-gpu" expected): carry .gpu and run
#   source .gpu/env.sh && bash benchmarks/gpu_session.sh backend
# The server benchmark (issue #16): carry .gpu and .srv (the server's wheels:
#   pip download -d .srv --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 \
#       --platform manylinux_2_28_x86_64 --platform any fastapi uvicorn httptools msgpack httpx click)
#   source .gpu/env.sh && bash benchmarks/gpu_session.sh serve:1000000
# fast-plaid (issue #4 comparison): carry .whl_fp (its wheels, see benchmarks/e2e_fastplaid.py) and run
#   bash benchmarks/gpu_session.sh fastplaid:1000000
set -uo pipefail
OUT=${OUT:-/tmp/mvdb-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the server's wheels (FastAPI, uvicorn, msgpack, httpx): carry .srv (pip download, see benchmarks/serve.py)
if ls .srv/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/srv .srv/*.whl \
        && export PYTHONPATH=/tmp/srv${PYTHONPATH:+:$PYTHONPATH}
fi
# this tree as the package mvdb: an editable install, or (where setuptools cannot build one
# offline) a symlinked package tree on PYTHONPATH
# offline) a symlinked package tree on PYTHONPATH, with the tests beside it (pytest then runs
# there, where the checkout's own mvdb/ folder does not shadow the package)
TESTROOT=$PWD
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    R=$PWD; rm -rf /tmp/pk && mkdir -p /tmp/pk && cp -rs "$R/mvdb" /tmp/pk/mvdb && ln -s "$R/kernels" /tmp/pk/mvdb/kernels \
        && ln -s "$R/storage" /tmp/pk/mvdb/storage && cp -rs "$R/tests" /tmp/pk/tests && cp "$R/pyproject.toml" /tmp/pk/ \
        && export PYTHONPATH=/tmp/pk${PYTHONPATH:+:$PYTHONPATH} && TESTROOT=/tmp/pk \
        || { cat "$OUT/install.log"; exit 1; }
fi
# pytest where the machine has none: carry .pyt (pip download pytest --python-version 3.12 --only-binary=:all: -d .pyt)
if ls .pyt/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/pt .pyt/*.whl \
        && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/pt
fi
python3 -c "import mvdb, sys; print('mvdb from', mvdb.__file__)" || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
for step in "$@"; do
    echo "=== $step ($(date +%T))"
    case "$step" in
        backend) (cd /tmp && python3 -c "import mvdb, mvdb.engine, numpy as np, tempfile
db = mvdb.open(tempfile.mkdtemp() + '/b.mvdb', device='cuda')
db.add([np.random.default_rng(0).standard_normal((20, 128)).astype(np.float32) for _ in range(100)])
print('mvdb.engine.index_backend():', mvdb.engine.index_backend(), '| db.stats():', db.stats()['index'],
      db.stats()['index_backend'])") 2>&1 | tee "$OUT/backend.log" ;;
        tests) (cd "$TESTROOT" && MVDB_AUTOTUNE=0 timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu tests) \
                   2>&1 | tee "$OUT/tests.log" | tail -15 ;;
        ktests) (cd "$TESTROOT" && MVDB_AUTOTUNE=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py) 2>&1 \
                    | tee "$OUT/ktests.log" | tail -8 ;;
        bench:*) timeout 480 python3 benchmarks/kernels.py --cases "${step#bench:}" --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" ;;
        sweep:*) timeout 480 python3 benchmarks/kernels.py --sweep --no-peers --cases "${step#sweep:}" --out "$OUT" 2>&1 | tee -a "$OUT/sweep.log" ;;
        dbtests) (cd "$TESTROOT" && timeout ${DBTESTS_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider tests/test_database.py \
                     tests/test_cli.py tests/test_lists.py) 2>&1 | tee "$OUT/dbtests.log" | tail -15 ;;
        e2e:*) timeout ${E2E_TIMEOUT:-400} python3 benchmarks/e2e.py --docs "${step#e2e:}" --out "$OUT" ${E2E_ARGS:-} 2>&1 | tee -a "$OUT/e2e.log" ;;
        fastplaid:*) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-fp \
                         .whl_fp/*.whl || { echo "fast-plaid wheels did not install (carry .whl_fp)"; continue; }
                     df -h /tmp | tail -1; PYTHONPATH=/tmp/site-fp${PYTHONPATH:+:$PYTHONPATH} timeout 570 python3 \
                         benchmarks/e2e_fastplaid.py --docs "${step#fastplaid:}" --out "$OUT" 2>&1 | tee -a "$OUT/fastplaid.log" ;;
        traintests) timeout 300 python3 -m pytest -q tests/test_train.py tests/test_colpali.py tests/test_pylate.py 2>&1 | tee "$OUT/traintests.log" | tail -15 ;;
        py:*) timeout ${PY_TIMEOUT:-400} python3 "benchmarks/${step#py:}.py" --out "$OUT" ${PY_ARGS:-} 2>&1 | tee -a "$OUT/py.log" ;;
        training:*) timeout 400 python3 benchmarks/training.py --cases "${step#training:}" --out "$OUT" 2>&1 | tee -a "$OUT/training.log" ;;
        multigpu:*) timeout ${MULTIGPU_TIMEOUT:-540} python3 benchmarks/multigpu.py --docs "${step#multigpu:}" \
                        --out "$OUT" 2>&1 | tee -a "$OUT/multigpu.log" ;;
        shardtests) timeout 300 python3 -m pytest -q tests/test_sharded.py 2>&1 | tee "$OUT/shardtests.log" | tail -5 ;;
        sparton:*) timeout ${SPARTON_TIMEOUT:-420} python3 benchmarks/sparton.py --vocab "${step#sparton:}" --out "$OUT" \
                       2>&1 | tee -a "$OUT/sparton.log" ;;
        spartonsweep) timeout 400 python3 benchmarks/sparton.py --sweep --out "$OUT" 2>&1 | tee -a "$OUT/sparton.log" ;;
        spartontests) timeout 200 python3 -m pytest -q tests/test_sparton.py 2>&1 | tee "$OUT/spartontests.log" | tail -5 ;;
        defaults:*) timeout ${DEFAULTS_TIMEOUT:-500} python3 benchmarks/defaults.py --docs "${step#defaults:}" --out "$OUT" \
                        ${DEFAULTS_ARGS:-} 2>&1 | tee -a "$OUT/defaults.log" ;;
        grow:*) timeout ${GROW_TIMEOUT:-400} python3 benchmarks/grow.py --docs "${step#grow:}" --out "$OUT" ${GROW_ARGS:-} \
                    2>&1 | tee -a "$OUT/grow.log" ;;
        pytest:*) (cd "$TESTROOT" && MVDB_AUTOTUNE=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests \
                      -k "${step#pytest:}") 2>&1 | tee -a "$OUT/pytest.log" | tail -8 ;;
        file:*) (cd "$TESTROOT" && MVDB_AUTOTUNE=0 timeout 300 python3 -m pytest -q -p no:cacheprovider "${step#file:}") \
                    2>&1 | tee -a "$OUT/pytest.log" | tail -8 ;;
        serve:*) timeout ${SERVE_TIMEOUT:-560} python3 benchmarks/serve.py --docs "${step#serve:}" --out "$OUT" \
                     ${SERVE_ARGS:-} 2>&1 | tee -a "$OUT/serve.log" ;;
        storage:*) df -h /tmp | tail -1; timeout 540 python3 benchmarks/storage.py --docs "${step#storage:}" \
                       --path /tmp/mvdb-bench.mvdb --out "$OUT" 2>&1 | tee -a "$OUT/storage.log" ;;
        *) echo "unknown step $step" ;;
    esac
done
echo "=== done ($(date +%T))"
