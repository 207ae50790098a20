#pragma once
// The subset of cuBLASLt that src/backend/cuda/matmul_lt.cpp calls, with the toolkit's enumerator
// values; emu_cublaslt.cpp computes the products naively on the host.
#include "cublas_v2.h"
struct EmuLtHandle { int device; };
struct EmuLtDesc {
  cublasComputeType_t compute; cudaDataType_t scale;
  int32_t transa = 0, transb = 0;
  uint32_t epilogue = 1;
  const void* bias = nullptr;
};
struct EmuLtLayout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; int32_t batch = 1; int64_t stride = 0; };
struct EmuLtPref { uint64_t max_workspace = 0; uint32_t align[4] = {256, 256, 256, 256}; };
using cublasLtHandle_t = EmuLtHandle*;
using cublasLtMatmulDesc_t = EmuLtDesc*;
using cublasLtMatrixLayout_t = EmuLtLayout*;
using cublasLtMatmulPreference_t = EmuLtPref*;
struct cublasLtMatmulAlgo_t { uint64_t data[8]; };
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo; size_t workspaceSize; cublasStatus_t state; float wavesCount; int reserved[4];
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4, CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8
};
enum cublasLtMatrixLayoutAttribute_t { CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 };
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
};
enum cublasLtEpilogue_t { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 };
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h);
const char* cublasLtGetStatusName(cublasStatus_t s);
const char* cublasLtGetStatusString(cublasStatus_t s);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t n);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t s);
// What the parity suite reads back (weak symbols there): heuristic queries and products so far, and
// the workspace bytes the last product was given. EMU_LT_DECLINE=1 makes the heuristic find nothing.
extern "C" long emu_lt_heuristic_calls();
extern "C" long emu_lt_matmul_calls();
extern "C" size_t emu_lt_last_workspace();
// Aborts unless [p, p + n) is live emulated device memory (emu_runtime.cpp).
void emu_check_device(const void* p, size_t n);
