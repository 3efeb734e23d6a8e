// GPU probe for tests/gpu/run.sh: asks for MIB of device memory through the CUDA runtime API or the
// driver API and prints one line:
//   granted|refused total=<MiB> free=<MiB> err=<error name>
// where total and free are what the process sees before the allocation (HAMi-core reports its
// cap as the total). Exit 0 whatever the answer; 2 when CUDA cannot start at all.
// A third argument HOLD (seconds, runtime API only) keeps a granted allocation that long before
// freeing it (tests/gpu/node-probe.sh: two processes of one container share one cap).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned hold_seconds = 0;

static int runtime_api(size_t bytes) {
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(0);  // creates the context
  if (e != cudaSuccess) {
    printf("error init=%s\n", cudaGetErrorName(e));
    return 2;
  }
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  void *p = NULL;
  e = cudaMalloc(&p, bytes);
  printf("%s total=%zu free=%zu err=%s\n", e == cudaSuccess ? "granted" : "refused",
         total_b >> 20, free_b >> 20, cudaGetErrorName(e));
  fflush(stdout);
  if (e == cudaSuccess && hold_seconds > 0) sleep(hold_seconds);
  if (e == cudaSuccess) cudaFree(p);
  return 0;
}

static int driver_api(size_t bytes) {
  CUdevice dev;
  CUcontext ctx;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("error init=%s\n", name);
    return 2;
  }
  size_t free_b = 0, total_b = 0;
  cuMemGetInfo(&free_b, &total_b);
  CUdeviceptr p = 0;
  r = cuMemAlloc(&p, bytes);
  const char *name = "?";
  cuGetErrorName(r, &name);
  printf("%s total=%zu free=%zu err=%s\n", r == CUDA_SUCCESS ? "granted" : "refused",
         total_b >> 20, free_b >> 20, name);
  if (r == CUDA_SUCCESS) cuMemFree(p);
  cuDevicePrimaryCtxRelease(dev);
  return 0;
}

// Not strtoul: glibc 2.38's headers bind it (and atol, inlined) to __isoc23_strtoul, which the
// workload image's older libc lacks when the probe is built on a newer host.
static unsigned long long parse_decimal(const char *s) {
  unsigned long long v = 0;
  while (*s >= '0' && *s <= '9') v = v * 10 + (unsigned long long)(*s++ - '0');
  return v;
}

int main(int argc, char **argv) {
  if ((argc != 3 && argc != 4) || (strcmp(argv[1], "runtime") && strcmp(argv[1], "driver"))) {
    fprintf(stderr, "usage: %s runtime|driver MIB [HOLD_SECONDS]\n", argv[0]);
    return 64;
  }
  if (argc == 4) hold_seconds = (unsigned)parse_decimal(argv[3]);
  size_t bytes = (size_t)parse_decimal(argv[2]) << 20;
  return strcmp(argv[1], "runtime") == 0 ? runtime_api(bytes) : driver_api(bytes);
}
