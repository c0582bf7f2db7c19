/* The CUDA backend's entry point in a build without CUDA (-Dcuda=disabled or no toolkit found). */
#include "ops.h"

#include "../../common/error.h"

cachalot_status cl_backend_cuda(cachalot_backend **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_cuda: out is NULL");
  *out = NULL;
  return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED,
                 "cachalot_backend_cuda: this build of cachalot has no CUDA backend (built with -Dcuda=disabled or "
                 "without the CUDA toolkit); use cachalot_backend_sim() for a simulated device");
}
