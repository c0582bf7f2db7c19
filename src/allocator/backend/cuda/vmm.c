/* Virtual memory (for expandable segments): the driver's VMM API, found through the runtime's
 * entry-point lookup (no link-time libcuda). A mapping is one physical allocation (cuMemCreate), mapped
 * and given read/write access for its device; its handle is released at once, so that cuMemUnmap frees
 * the memory. */
#include "private.h"

#include <cuda.h>

#include <pthread.h>

static struct {
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*error_name)(CUresult, const char **);
  bool ok;
} vmm;
static pthread_once_t vmm_once = PTHREAD_ONCE_INIT;

/* A driver function through the runtime's entry-point lookup, in its CUDA 12.0 signature; NULL when the
 * driver has none. */
void *cl_cuda_driver_symbol(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

static void find_vmm(void) {
  vmm.device_get = (CUresult(*)(CUdevice *, int))cl_cuda_driver_symbol("cuDeviceGet");
  vmm.granularity = (CUresult(*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))
      cl_cuda_driver_symbol("cuMemGetAllocationGranularity");
  vmm.reserve = (CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
      cl_cuda_driver_symbol("cuMemAddressReserve");
  vmm.address_free = (CUresult(*)(CUdeviceptr, size_t))cl_cuda_driver_symbol("cuMemAddressFree");
  vmm.create = (CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long))cl_cuda_driver_symbol("cuMemCreate");
  vmm.map = (CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))
      cl_cuda_driver_symbol("cuMemMap");
  vmm.set_access = (CUresult(*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))
      cl_cuda_driver_symbol("cuMemSetAccess");
  vmm.unmap = (CUresult(*)(CUdeviceptr, size_t))cl_cuda_driver_symbol("cuMemUnmap");
  vmm.release = (CUresult(*)(CUmemGenericAllocationHandle))cl_cuda_driver_symbol("cuMemRelease");
  vmm.error_name = (CUresult(*)(CUresult, const char **))cl_cuda_driver_symbol("cuGetErrorName");
  vmm.ok = vmm.device_get && vmm.granularity && vmm.reserve && vmm.address_free && vmm.create && vmm.map &&
           vmm.set_access && vmm.unmap && vmm.release;
}

static cachalot_status vmm_fail(CUresult r, const char *op, const char *call) {
  const char *name = NULL;
  if (!vmm.error_name || vmm.error_name(r, &name) != CUDA_SUCCESS || !name)
    name = "unknown error";
  return cl_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? CACHALOT_ERROR_OUT_OF_MEMORY : CACHALOT_ERROR_DEVICE,
                 "cuda backend: %s: %s failed: %s (%d)", op, call, name, (int)r);
}

/* Makes `device`'s primary context current on this thread (the driver calls need one), remembering the
 * previous device in *sc; the VMM API also needs to be there. */
static cachalot_status vmm_enter(int device, cl_cuda_device_scope *sc, const char *op) {
  pthread_once(&vmm_once, find_vmm);
  if (!vmm.ok)
    return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED, "cuda backend: %s: the driver has no virtual memory API", op);
  sc->prev = 0;
  sc->switched = false;
  cudaError_t err = cudaGetDevice(&sc->prev);
  if (err == cudaSuccess)
    err = cudaSetDevice(device); /* also when it is current: it makes the primary context current */
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, op, "cudaSetDevice");
  sc->switched = sc->prev != device;
  return CACHALOT_OK;
}

static CUmemAllocationProp vmm_prop(CUdevice dev) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

cachalot_status cl_cuda_va_granularity(cachalot_backend *b, int device, size_t *out) {
  (void)b;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: va_granularity: out is NULL");
  *out = 0;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_granularity");
  if (st != CACHALOT_OK)
    return st;
  CUdevice dev = 0;
  CUresult r = vmm.device_get(&dev, device);
  CUmemAllocationProp prop = vmm_prop(dev);
  if (r == CUDA_SUCCESS)
    r = vmm.granularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_granularity", "cuMemGetAllocationGranularity");
}

cachalot_status cl_cuda_va_reserve(cachalot_backend *b, int device, size_t size, void **base) {
  (void)b;
  if (!base)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: va_reserve: base is NULL");
  *base = NULL;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_reserve");
  if (st != CACHALOT_OK)
    return st;
  CUdeviceptr p = 0;
  CUresult r = vmm.reserve(&p, size, 0, 0, 0);
  device_leave(&sc);
  if (r != CUDA_SUCCESS)
    return vmm_fail(r, "va_reserve", "cuMemAddressReserve");
  *base = (void *)(uintptr_t)p;
  return CACHALOT_OK;
}

cachalot_status cl_cuda_va_release(cachalot_backend *b, int device, void *base, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_release");
  if (st != CACHALOT_OK)
    return st;
  CUresult r = vmm.address_free((CUdeviceptr)(uintptr_t)base, size);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_release", "cuMemAddressFree");
}

cachalot_status cl_cuda_va_map(cachalot_backend *b, int device, void *addr, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_map");
  if (st != CACHALOT_OK)
    return st;
  const CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
  CUdevice dev = 0;
  CUmemGenericAllocationHandle h = 0;
  const char *call = "cuDeviceGet";
  CUresult r = vmm.device_get(&dev, device);
  CUmemAllocationProp prop = vmm_prop(dev);
  if (r == CUDA_SUCCESS && (r = vmm.create(&h, size, &prop, 0)) != CUDA_SUCCESS)
    call = "cuMemCreate";
  else if (r == CUDA_SUCCESS) {
    if ((r = vmm.map(p, size, 0, h, 0)) != CUDA_SUCCESS) {
      call = "cuMemMap";
    } else {
      CUmemAccessDesc access = {0};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = dev;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if ((r = vmm.set_access(p, size, &access, 1)) != CUDA_SUCCESS) {
        call = "cuMemSetAccess";
        (void)vmm.unmap(p, size);
      }
    }
    (void)vmm.release(h); /* mapped: the mapping keeps the memory until cuMemUnmap; else it goes now */
  }
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_map", call);
}

cachalot_status cl_cuda_va_unmap(cachalot_backend *b, int device, void *addr, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_unmap");
  if (st != CACHALOT_OK)
    return st;
  CUresult r = vmm.unmap((CUdeviceptr)(uintptr_t)addr, size);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_unmap", "cuMemUnmap");
}
