// SM-limit probe for tests/gpu/run.sh: launches LAUNCHES busy kernels (each spinning CYCLES clock
// cycles on every SM) and prints one line:
//   elapsed_ms=<ms> launches=<n> sms=<n>
// HAMi-core's compute limiter delays launches once its utilization watcher runs: a throttled run
// takes a multiple of the unthrottled time. Exit 2 when CUDA cannot start.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LAUNCHES CYCLES\n", argv[0]);
    return 64;
  }
  int launches = atoi(argv[1]);
  long long cycles = atoll(argv[2]);
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(0);
  if (e != cudaSuccess) {
    printf("error init=%s\n", cudaGetErrorName(e));
    return 2;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  double t0 = now_ms();
  for (int i = 0; i < launches; i++) spin<<<sms, 128>>>(cycles);
  e = cudaDeviceSynchronize();
  double t1 = now_ms();
  printf("elapsed_ms=%.1f launches=%d sms=%d err=%s\n", t1 - t0, launches, sms, cudaGetErrorName(e));
  return 0;
}
