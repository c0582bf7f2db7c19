/* Streams on the CUDA runtime: what stream a handle is and whether it can be asked (capturing streams
 * answer few questions), creating, destroying, waiting on and synchronizing streams and devices, and
 * copies enqueued on a stream. */
#include "private.h"

/* Whether stream `s` (not NULL) takes part in a capture, active or invalidated. Of the stream queries,
 * only cudaStreamGetCaptureInfo may be asked of a capturing stream: cudaStreamGetDevice, GetFlags, GetId
 * and cuStreamGetCtx fail with cudaErrorStreamCaptureUnsupported and invalidate the capture, whatever
 * the capture and thread modes (seen on CUDA 13.0, driver 580.159). */
static cudaError_t stream_capturing(cachalot_stream s, bool *capturing) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamGetCaptureInfo(s, &status, NULL, NULL, NULL, NULL, NULL);
  *capturing = err == cudaSuccess && status != cudaStreamCaptureStatusNone;
  return err;
}

/* The device of stream `s`; NULL (the legacy stream) is `device`'s. A capturing stream cannot be asked
 * (see stream_capturing), so it is taken to be `device`'s: the caller's device, which is the capture's
 * in every use cachalot makes of it. */
cudaError_t cl_cuda_stream_device(cachalot_stream s, int device, int *out) {
  *out = device;
  if (!s)
    return cudaSuccess;
  bool capturing = false;
  cudaError_t err = stream_capturing(s, &capturing);
  if (err != cudaSuccess || capturing)
    return err;
  return cudaStreamGetDevice(s, out);
}

cachalot_status cl_cuda_stream_check(cachalot_backend *b, cachalot_stream s) {
  (void)b;
  if (!s)
    return CACHALOT_OK;
  /* The one query a capturing stream answers (record_stream may be called during a capture), and one
   * that fails on a handle that is no stream. */
  bool capturing = false;
  cudaError_t err = stream_capturing(s, &capturing);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: %p is not a usable stream: %s", (void *)s,
                   cudaGetErrorString(err));
  }
  return CACHALOT_OK;
}

/* An event from the pool of the device of `s`, recorded on `s` (with that device current), waited on by
 * `waiter` (with its device current), and returned to the pool: the wait keeps the state the event had
 * when it was made, so re-recording the event later does not affect it. During a capture, this record and
 * wait are how a side stream joins the capture (a fork) and how its work is joined back; a capturing
 * stream is then taken to be of `device` (see cl_cuda_stream_device). */
cachalot_status cl_cuda_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s) {
  cl_event *e = NULL;
  cachalot_status st = cl_cuda_event_record(b, device, s, &e);
  if (st != CACHALOT_OK) {
    cl_error_prefix("cuda backend: stream_wait: recording on the waited stream: ");
    return st;
  }
  int wdev = device;
  cudaError_t derr = cl_cuda_stream_device(waiter, device, &wdev);
  if (derr != cudaSuccess) {
    cl_cuda_event_release(b, e);
    return cuda_fail(CACHALOT_ERROR_DEVICE, derr, "stream_wait", "cudaStreamGetDevice");
  }
  if (wdev < 0 || wdev >= b->device_count)
    wdev = device;
  cl_cuda_device_scope sc;
  st = device_enter(wdev, &sc, "stream_wait");
  if (st != CACHALOT_OK) {
    cl_cuda_event_release(b, e);
    return st;
  }
  cudaError_t err = cudaStreamWaitEvent(waiter, e->ev, 0);
  device_leave(&sc);
  cl_cuda_event_release(b, e);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_wait", "cudaStreamWaitEvent");
  return CACHALOT_OK;
}

cachalot_status cl_cuda_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  (void)b;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: stream_create: out is NULL");
  *out = NULL;
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "stream_create");
  if (st != CACHALOT_OK)
    return st;
  cudaStream_t s = NULL;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_create", "cudaStreamCreateWithFlags");
  *out = s;
  return CACHALOT_OK;
}

void cl_cuda_stream_destroy(cachalot_backend *b, cachalot_stream s) {
  (void)b;
  /* Deliberately the plain name, not a table entry like cudaMalloc's: in libcachalot_preload.so it binds
   * to the interposer's exported cudaStreamDestroy, which tells the allocator (cachalot_forget_stream)
   * before it calls the runtime's, so a stream destroyed here is forgotten like one the program destroys.
   * That edge comes from how the library's symbols bind, not from this source. */
  if (s && cudaStreamDestroy(s) != cudaSuccess)
    (void)cudaGetLastError();
}

cachalot_status cl_cuda_stream_sync(cachalot_backend *b, int device, cachalot_stream s) {
  (void)b;
  /* The device must be current: NULL names the current device's legacy stream. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "stream_sync");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaStreamSynchronize(s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_sync", "cudaStreamSynchronize");
  return CACHALOT_OK;
}

cachalot_status cl_cuda_device_sync(cachalot_backend *b, int device) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "device_sync");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaDeviceSynchronize();
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "device_sync", "cudaDeviceSynchronize");
  return CACHALOT_OK;
}

cachalot_status cl_cuda_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                     cachalot_stream s) {
  (void)b;
  if (n == 0)
    return CACHALOT_OK;
  if (!dst || !src)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: memcpy_async: %s is NULL for %zu bytes",
                   !dst ? "dst" : "src", n);
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "memcpy_async");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "memcpy_async", "cudaMemcpyAsync");
  return CACHALOT_OK;
}
