#pragma once
// The part of cuDNN 9's convolution API that braid's CUDA backend calls (src/backend/cuda/cudnn_conv.cpp),
// implemented on the host by emu_cudnn.cpp (not part of braid).
#include <cstddef>
#include "cuda_runtime.h"
enum cudnnStatus_t {
  CUDNN_STATUS_SUCCESS = 0, CUDNN_STATUS_NOT_INITIALIZED = 1001, CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000, CUDNN_STATUS_NOT_SUPPORTED_LAYOUT = 3004, CUDNN_STATUS_INTERNAL_ERROR = 4000,
  CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004, CUDNN_STATUS_EXECUTION_FAILED = 5000,
};
enum cudnnDataType_t { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_DOUBLE = 1, CUDNN_DATA_HALF = 2, CUDNN_DATA_BFLOAT16 = 9 };
enum cudnnMathType_t { CUDNN_DEFAULT_MATH = 0, CUDNN_TENSOR_OP_MATH = 1, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2, CUDNN_FMA_MATH = 3 };
enum cudnnTensorFormat_t { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 };
enum cudnnConvolutionMode_t { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 };
enum cudnnDeterminism_t { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 };
enum cudnnConvolutionFwdAlgo_t { CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1, CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2, CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8 };
enum cudnnConvolutionBwdDataAlgo_t { CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6 };
enum cudnnConvolutionBwdFilterAlgo_t { CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7 };
struct cudnnContext;
struct cudnnTensorStruct;
struct cudnnFilterStruct;
struct cudnnConvolutionStruct;
using cudnnHandle_t = cudnnContext*;
using cudnnTensorDescriptor_t = cudnnTensorStruct*;
using cudnnFilterDescriptor_t = cudnnFilterStruct*;
using cudnnConvolutionDescriptor_t = cudnnConvolutionStruct*;
#define EMU_CUDNN_PERF(Name, Algo) \
  struct Name { Algo algo; cudnnStatus_t status; float time; size_t memory; cudnnDeterminism_t determinism; cudnnMathType_t mathType; int reserved[3]; };
EMU_CUDNN_PERF(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t)
EMU_CUDNN_PERF(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t)
EMU_CUDNN_PERF(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t)
using cudnnTensorDescriptor_t = cudnnTensorStruct*;
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
const char* cudnnGetErrorString(cudnnStatus_t status);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d);
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t d, cudnnDataType_t t, int n, int c, int h, int w,
                                           int ns, int cs, int hs, int ws);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int k,
                                         int c, int h, int w);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int u, int v, int dh,
                                              int dw, cudnnConvolutionMode_t mode, cudnnDataType_t compute);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y,
                                                     int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t, cudnnTensorDescriptor_t x, const void* xp,
                                                     cudnnFilterDescriptor_t w, const void* wp,
                                                     cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y,
                                                     void* yp, int requested, int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t wsn);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* n);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void* alpha, cudnnTensorDescriptor_t x, const void* xp,
                                      cudnnFilterDescriptor_t w, const void* wp, cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t wsn, const void* beta,
                                      cudnnTensorDescriptor_t y, void* yp);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t conv,
                                                          cudnnTensorDescriptor_t dx, int requested, int* returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t, cudnnFilterDescriptor_t w, const void* wp,
                                                          cudnnTensorDescriptor_t dy, const void* dyp,
                                                          cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx,
                                                          void* dxp, int requested, int* returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, size_t wsn);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                           cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t conv,
                                                           cudnnTensorDescriptor_t dx, cudnnConvolutionBwdDataAlgo_t algo,
                                                           size_t* n);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void* alpha, cudnnFilterDescriptor_t w, const void* wp,
                                           cudnnTensorDescriptor_t dy, const void* dyp, cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t wsn, const void* beta,
                                           cudnnTensorDescriptor_t dx, void* dxp);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                            cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t conv,
                                                            cudnnFilterDescriptor_t dw, int requested, int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t, cudnnTensorDescriptor_t x, const void* xp,
                                                            cudnnTensorDescriptor_t dy, const void* dyp,
                                                            cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw,
                                                            void* dwp, int requested, int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
                                                            size_t wsn);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                             cudnnTensorDescriptor_t dy,
                                                             cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* n);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void* alpha, cudnnTensorDescriptor_t x, const void* xp,
                                             cudnnTensorDescriptor_t dy, const void* dyp,
                                             cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdFilterAlgo_t algo,
                                             void* ws, size_t wsn, const void* beta, cudnnFilterDescriptor_t dw, void* dwp);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t, const void* alpha, cudnnTensorDescriptor_t a, const void* ap,
                             const void* beta, cudnnTensorDescriptor_t c, void* cp);
// Test hook of the emulation: the next call of the function named call returns status instead.
extern "C" void emu_cudnn_fail(const char* call, int status);
