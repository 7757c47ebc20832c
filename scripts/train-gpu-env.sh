# To be sourced on the GPU machine before running the CUDA trainer that
# scripts/build-train-cuda.sh builds (target/cuda/release/dflash-train):
#   source scripts/train-gpu-env.sh [BINARY] [PYTHON]
# Puts the CUDA 13 libraries of a Python environment that has them (PyTorch cu130's
# nvidia-* wheels: site-packages/nvidia/*/lib, e.g. nvidia/cu13/lib with libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13, libcurand.so.10, libnvrtc.so.13) in front of
# LD_LIBRARY_PATH. libcuda.so.1 comes from the system's driver (never the build's stub);
# where the loader cannot find it but the container mounts it in /usr/local/nvidia/lib64
# (or lib), that dir goes at the end of LD_LIBRARY_PATH.
# PYTHON defaults to $PYTHON or python3. With BINARY, lists what its loader still lacks
# (`ldd`), and returns 1 if anything does. No `set -e` here: it is sourced.
_dflash_py=${2:-${PYTHON:-python3}}
_dflash_dirs=$("$_dflash_py" - <<'PY'
import glob, os, site, sys
roots = []
try:
    import nvidia  # a namespace package: one path per site-packages that has it
    roots += list(nvidia.__path__)
except ImportError:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    roots.append(os.path.join(sp, "nvidia"))
dirs = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        d = os.path.realpath(d)
        if d not in dirs and glob.glob(os.path.join(d, "lib*.so*")):
            dirs.append(d)
print(":".join(dirs))
PY
) || _dflash_dirs=
if [ -z "$_dflash_dirs" ]; then
  echo "[train-gpu-env] no site-packages/nvidia/*/lib under $_dflash_py" >&2
else
  export LD_LIBRARY_PATH="$_dflash_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "[train-gpu-env] LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >&2
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' &&
  ! (IFS=:; for d in ${LD_LIBRARY_PATH:-}; do [ -e "$d/libcuda.so.1" ] && exit 0; done; exit 1); then
  for _dflash_d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    if [ -e "$_dflash_d/libcuda.so.1" ]; then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$_dflash_d"
      echo "[train-gpu-env] libcuda.so.1 from $_dflash_d" >&2
      break
    fi
  done
fi
unset _dflash_py _dflash_dirs _dflash_d
if [ -n "${1:-}" ]; then
  if ldd "$1" | grep 'not found' >&2; then
    echo "[train-gpu-env] $1 lacks the libraries above" >&2
    return 1 2>/dev/null || exit 1
  fi
  ldd "$1" | grep -E 'libcuda\.|cublas|curand|nvrtc|cudart' >&2
fi
