/* Graphs on the CUDA runtime (used by src/graph/): instantiating, launching and destroying what a capture
 * produced, and its DOT dump. */
#include "private.h"

cachalot_status cl_cuda_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec) {
  (void)b;
  if (!exec)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_instantiate: exec is NULL");
  *exec = NULL;
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_instantiate: graph is NULL");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "graph_instantiate");
  if (st != CACHALOT_OK)
    return st;
  cudaGraphExec_t e = NULL;
  cudaError_t err = cudaGraphInstantiateWithFlags(&e, (cudaGraph_t)g, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "graph_instantiate", "cudaGraphInstantiateWithFlags");
  *exec = (cl_graph_exec *)e;
  return CACHALOT_OK;
}

cachalot_status cl_cuda_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s) {
  (void)b;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_launch: instance is NULL");
  /* The device must be current: NULL names the current device's legacy stream. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "graph_launch");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaGraphLaunch((cudaGraphExec_t)e, s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "graph_launch", "cudaGraphLaunch");
  return CACHALOT_OK;
}

void cl_cuda_graph_destroy(cachalot_backend *b, cl_graph *g) {
  (void)b;
  if (g && cudaGraphDestroy((cudaGraph_t)g) != cudaSuccess)
    (void)cudaGetLastError();
}

void cl_cuda_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e) {
  (void)b;
  if (e && cudaGraphExecDestroy((cudaGraphExec_t)e) != cudaSuccess)
    (void)cudaGetLastError();
}

cachalot_status cl_cuda_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path) {
  (void)b;
  if (!g || !path)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_debug_dot: %s is NULL",
                   !g ? "graph" : "path");
  cudaError_t err = cudaGraphDebugDotPrint((cudaGraph_t)g, path, cudaGraphDebugDotFlagsVerbose);
  if (err != cudaSuccess) {
    /* cudaErrorOperatingSystem is what CUDA 13 says when the file cannot be opened (a bad path, as the
     * simulated backend's INVALID_ARGUMENT), cudaErrorInvalidValue for a bad graph. */
    bool bad_arg = err == cudaErrorOperatingSystem || err == cudaErrorInvalidValue;
    cachalot_status rc = cuda_fail(bad_arg ? CACHALOT_ERROR_INVALID_ARGUMENT : CACHALOT_ERROR_DEVICE, err,
                                   "graph_debug_dot", "cudaGraphDebugDotPrint");
    cl_error_prefix("writing '%s': ", path);
    return rc;
  }
  return CACHALOT_OK;
}
