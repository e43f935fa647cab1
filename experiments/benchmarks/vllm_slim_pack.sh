#!/usr/bin/env bash
# Slim the vLLM carry of ../shared/device/vllm_pack.sh for the device tool's 64 MiB calls.
# Run from the project's root after `bash ../shared/device/vllm_pack.sh` (which fills .vllm/part_NN).
# It unpacks every wheel into one site folder, drops what a dense model on a Hopper GPU never
# loads (FlashAttention-2 kernels: Hopper takes FA3; the MoE kernels, imported under a suppress;
# the Rust frontend binary, used only with VLLM_USE_RUST_FRONTEND=1; deep_gemm builds for other
# Pythons), and packs it as .vllm/slim_NN (tar.xz parts). Half the calls of the wheel parts.
# On the device, one call per part, back to back (the machine stays warm 30 s after a call):
#   carry [".vllm/slim_NN"], command: mkdir -p /tmp/v && cp .vllm/slim_NN /tmp/v/
# and in the call that uses it:
#   cat /tmp/v/slim_* .vllm/slim_LAST | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/vsite')"
#   export PYTHONPATH=/tmp/vsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0
set -euo pipefail
[ -f pyproject.toml ] && ls .vllm/part_00 >/dev/null || { echo "run vllm_pack.sh first, from the project's root" >&2; exit 2; }
work=$(mktemp -d); mkdir -p "$work/w" "$work/site"
cat .vllm/part_* | tar x -C "$work/w"
for whl in "$work"/w/*.whl; do python3 -m zipfile -e "$whl" "$work/site"; done
for data in "$work"/site/*.data; do  # wheels' purelib/platlib trees belong in site-packages
  for lib in purelib platlib; do [ -d "$data/$lib" ] && cp -r "$data/$lib/." "$work/site/"; done
  rm -rf "$data"
done
rm -f "$work"/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work"/site/vllm/_moe_C.abi3.so "$work"/site/vllm/vllm-rs
find "$work"/site/vllm/third_party -name '_C.cpython-3[!1][!2]*' -delete 2>/dev/null || true
find "$work"/site/vllm/third_party -name '_C.cpython-311*' -delete 2>/dev/null || true
tree=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
mib=$(( (62 * 1024 * 1024 - tree) / 1024 / 1024 ))
rm -f .vllm/slim_*
tar c -C "$work/site" . | xz -T2 -9 | split -b "${mib}M" -d - .vllm/slim_
rm -rf "$work"
ls -la .vllm/slim_*
