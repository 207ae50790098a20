#!/bin/bash
# Builds braid's CUDA backend against the host emulation and links a libbraid.so with it.
#   tools/cuda_emu/build.sh [BUILD_DIR]   (default build-cuda: a tree configured with -Dcuda=enabled)
# then run $EMU_DIR/test_cuda_backend and the other parity suites, tests/test_cuda_*.cpp (EMU_DIR defaults to /tmp/braid_cuda_emu), and, in a tree built
# with NCCL, $EMU_DIR/test_nccl (a world of one).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "$root" && cd "${1:-build-cuda}" && pwd)
emu=${EMU_DIR:-/tmp/braid_cuda_emu}
mkdir -p "$emu"
cp -r "$here"/shim "$here"/gen.py "$here"/emu_runtime.cpp "$here"/emu_cublaslt.cpp "$here"/emu_cudnn.cpp "$emu"/
cd "$emu"
rm -rf src obj && mkdir -p src/backend/cuda obj
cp $root/src/backend/cuda/*.h $root/src/backend/cuda/*.cpp src/backend/cuda/
for f in $root/src/backend/cuda/*.cu $root/src/backend/cuda/*.cuh; do
  b=$(basename $f); python3 gen.py $f src/backend/cuda/${b%.cu}$( [[ $b == *.cu ]] && echo .cpp || echo "" )
done
# common.cuh keeps its name (gen.py wrote it under the same name)
# Through ccache where it is installed (Note [Compiler cache] in scripts/run_tests.sh): CI rebuilds
# the emulation in every fresh clone.
CXX="g++"
if command -v ccache >/dev/null; then CXX="ccache g++"; fi
FLAGS="-std=c++20 -O1 -g -fPIC -Wall -Wextra -I$emu/shim -I$emu/src -I$root/src -I$root/include -I$build/include -I$root -DBRAID_BUILDING_LIBRARY"
# The NCCL group and its point-to-point transport (a world of one against shim/nccl.h) where the tree was built with NCCL.
if grep -q '#define BRAID_HAVE_NCCL' $build/include/braid/config.h; then cp $root/distributed/nccl_group.cpp $root/distributed/nccl_p2p.cpp src/; fi
objs=()
for f in src/backend/cuda/*.cpp src/*.cpp emu_runtime.cpp emu_cublaslt.cpp emu_cudnn.cpp; do
  o=obj/$(basename $f .cpp).o
  $CXX $FLAGS -c $f -o $o &
  objs+=($o)
done
wait
# libbraid's link line from build-cuda, with the real CUDA objects and libraries swapped for these.
cmd=$(cd $build && ninja -t commands libbraid.so | tail -1)
cmd=$(echo "$cmd" | sed -e 's#src/backend/cuda/libbraid_cuda.a.p/[a-z_]*\.\(cu\|cpp\)\.o##g' -e 's#/usr/local/cuda[-0-9.]*/lib[0-9]*/libcud[a-z]*\.so##g' -e "s#-o libbraid.so#-o $emu/libbraid.so#")
objabs=""
for o in "${objs[@]}"; do objabs="$objabs $emu/$o"; done
(cd $build && eval "$cmd $objabs")
# Every CUDA parity suite (tests/test_cuda_*.cpp), compiled, then linked (ccache keeps compilations only).
for t in $root/tests/test_cuda_*.cpp; do
  b=$(basename $t .cpp)
  $CXX -std=c++20 -O1 -g -I$root/tests -I$root/src -I$root/include -I$build/include -c $t -o obj/$b.o &
done
wait
for t in $root/tests/test_cuda_*.cpp; do
  b=$(basename $t .cpp)
  g++ obj/$b.o -o $emu/$b -L$emu -lbraid -lgtest -lgtest_main -pthread -Wl,-rpath,$emu
done
if [[ -f src/nccl_group.cpp ]]; then
  $CXX -std=c++20 -O1 -g -I$emu/shim -I$root/tests -I$root/src -I$root/include -I$build/include \
    -c $root/tests/test_nccl.cpp -o obj/test_nccl.o
  g++ obj/test_nccl.o -o $emu/test_nccl -L$emu -lbraid -lgtest -lgtest_main -pthread -Wl,-rpath,$emu
fi
echo built
