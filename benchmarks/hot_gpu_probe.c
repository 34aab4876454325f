// The hot file -> GPU pipeline in miniature, to compare page-cache copies: T threads, each with a
// ring of two pinned 4 MiB buffers, its own stream and an event per buffer (the shape of
// ferrio's bounce ring); each chunk is copied from the page cache into a buffer with pread, or
// with memcpy from an mmap of the file, then sent to the GPU with cuMemcpyHtoDAsync. Driver API
// through dlopen; built here against the CUDA headers of the nvidia-cuda-runtime wheel:
//
//   gcc -O2 -pthread -I target/pool_bench_build/nvidia/cu13/include
//     -o .carry/probe/hot_gpu_probe benchmarks/hot_gpu_probe.c -ldl
//   there: cat FILE >/dev/null twice, then hot_gpu_probe FILE 16
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CH (4u << 20)
#define F(name, ...) static CUresult (*p_##name)(__VA_ARGS__)
F(cuInit, unsigned);
F(cuDeviceGet, CUdevice*, int);
F(cuDevicePrimaryCtxRetain, CUcontext*, CUdevice);
F(cuCtxSetCurrent, CUcontext);
F(cuMemAlloc_v2, CUdeviceptr*, size_t);
F(cuMemHostAlloc, void**, size_t, unsigned);
F(cuStreamCreate, CUstream*, unsigned);
F(cuEventCreate, CUevent*, unsigned);
F(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void*, size_t, CUstream);
F(cuEventRecord, CUevent, CUstream);
F(cuEventSynchronize, CUevent);
F(cuStreamSynchronize, CUstream);

static void ck(CUresult r, const char* what)
{
  if (r != CUDA_SUCCESS) { fprintf(stderr, "%s failed: %d\n", what, (int)r); exit(1); }
}
static double now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int fd, mode, T;
static size_t size;
static const char* map;
static CUcontext ctx;
static CUdeviceptr dev;

struct ring {
  void* buf[2];
  CUstream s;
  CUevent e[2];
  int used[2];
} rings[256];

static void* work(void* arg)
{
  long t = (long)arg;
  struct ring* r = &rings[t];
  ck(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  size_t n = (size + CH - 1) / CH;
  int k = 0;
  for (size_t i = t; i < n; i += T, k ^= 1) {
    size_t off = i * CH, len = size - off < CH ? size - off : CH;
    if (r->used[k]) { ck(p_cuEventSynchronize(r->e[k]), "cuEventSynchronize"); }
    if (mode == 0) {
      if (pread(fd, r->buf[k], len, off) != (ssize_t)len) { perror("pread"); exit(1); }
    } else {
      memcpy(r->buf[k], map + off, len);
    }
    ck(p_cuMemcpyHtoDAsync_v2(dev + off, r->buf[k], len, r->s), "cuMemcpyHtoDAsync");
    ck(p_cuEventRecord(r->e[k], r->s), "cuEventRecord");
    r->used[k] = 1;
  }
  ck(p_cuStreamSynchronize(r->s), "cuStreamSynchronize");
  return NULL;
}

int main(int c, char** v)
{
  if (c < 3) { fprintf(stderr, "usage: hot_gpu_probe FILE THREADS...\n"); return 2; }
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
#define L(name) *(void**)&p_##name = dlsym(h, #name); if (!p_##name) { fprintf(stderr, "no %s\n", #name); return 1; }
  L(cuInit) L(cuDeviceGet) L(cuDevicePrimaryCtxRetain) L(cuCtxSetCurrent) L(cuMemAlloc_v2)
  L(cuMemHostAlloc) L(cuStreamCreate) L(cuEventCreate) L(cuMemcpyHtoDAsync_v2) L(cuEventRecord)
  L(cuEventSynchronize) L(cuStreamSynchronize)
  CUdevice d;
  ck(p_cuInit(0), "cuInit");
  ck(p_cuDeviceGet(&d, 0), "cuDeviceGet");
  ck(p_cuDevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
  ck(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  fd = open(v[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) { perror(v[1]); return 1; }
  size = st.st_size;
  ck(p_cuMemAlloc_v2(&dev, size), "cuMemAlloc");
  for (int t = 0; t < 256; t++) {
    for (int k = 0; k < 2; k++) {
      ck(p_cuMemHostAlloc(&rings[t].buf[k], CH, 0), "cuMemHostAlloc");
      ck(p_cuEventCreate(&rings[t].e[k], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    ck(p_cuStreamCreate(&rings[t].s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  const char* names[] = {"pread", "mmap+memcpy"};
  for (int ti = 2; ti < c; ti++) {
    T = atoi(v[ti]);
    for (int round = 0; round < 3; round++) {
      for (mode = 0; mode < 2; mode++) {
        if (mode) { map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0); }
        for (int t = 0; t < T; t++) { rings[t].used[0] = rings[t].used[1] = 0; }
        pthread_t th[256];
        double t0 = now();
        for (long t = 0; t < T; t++) { pthread_create(&th[t], NULL, work, (void*)t); }
        for (int t = 0; t < T; t++) { pthread_join(th[t], NULL); }
        double g = size / (now() - t0) / (1 << 30);
        if (mode) { munmap((void*)map, size); }
        printf("threads %2d round %d %-12s %6.2f GiB/s\n", T, round, names[mode], g);
        fflush(stdout);
      }
    }
  }
  return 0;
}
