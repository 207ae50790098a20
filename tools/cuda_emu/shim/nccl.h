// The part of NCCL's API that distributed/nccl_group.cpp and nccl_p2p.cpp use, for the host emulation
// (a world of one, and a rank's sends to itself; emu_runtime.cpp). Not part of braid.
#pragma once
#include <cstddef>
#include "cuda_runtime.h"
enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
};
enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
struct ncclUniqueId {
  char internal[128];
};
struct ncclComm;
using ncclComm_t = ncclComm*;
struct ncclConfig_t {
  int blocking = 1;
};
#define NCCL_CONFIG_INITIALIZER ncclConfig_t{}
const char* ncclGetErrorString(ncclResult_t r);
const char* ncclGetLastError(ncclComm_t c);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* r);
ncclResult_t ncclCommAbort(ncclComm_t c);
ncclResult_t ncclCommFinalize(ncclComm_t c);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st);
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st);
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
