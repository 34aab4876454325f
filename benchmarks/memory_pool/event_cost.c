// Cost per call of the CUDA driver calls a stream-ordered pool makes (cuEventRecord,
// cuEventQuery, cuStreamWaitEvent, cuEventCreate+Destroy) with 1, 4 and 16 threads calling at
// once, on idle streams and on streams kept busy by large memsets. Results: RESULTS.md here.
//
//   nvcc -O2 -o /tmp/event_cost benchmarks/memory_pool/event_cost.c -lcuda -lpthread && /tmp/event_cost
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) { \
  const char *s_; cuGetErrorString(r_, &s_); fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_); exit(1);} } while (0)

static CUcontext ctx;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

enum { N = 20000 };
typedef struct { int id; int busy; double rec, query, wait, create; } job_t;
static pthread_barrier_t bar;

static void *worker(void *p) {
  job_t *j = p;
  CK(cuCtxSetCurrent(ctx));
  CUstream s, t; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); CK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr buf = 0; size_t bytes = 256u << 20;
  if (j->busy) CK(cuMemAlloc(&buf, bytes));
  pthread_barrier_wait(&bar);
  double a = now();
  for (int i = 0; i < N; i++) {
    if (j->busy && (i % 1000) == 0) CK(cuMemsetD32Async(buf, i, bytes / 4, s));
    CK(cuEventRecord(ev, s));
  }
  double b = now();
  for (int i = 0; i < N; i++) { CUresult r = cuEventQuery(ev); (void)r; }
  double c = now();
  for (int i = 0; i < N; i++) CK(cuStreamWaitEvent(t, ev, 0));
  double d = now();
  for (int i = 0; i < N / 10; i++) { CUevent e; CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)); CK(cuEventDestroy(e)); }
  double e = now();
  j->rec = (b - a) / N; j->query = (c - b) / N; j->wait = (d - c) / N; j->create = (e - d) / (N / 10);
  CK(cuStreamSynchronize(s)); CK(cuStreamSynchronize(t));
  if (buf) CK(cuMemFree(buf));
  CK(cuEventDestroy(ev)); CK(cuStreamDestroy(s)); CK(cuStreamDestroy(t));
  return NULL;
}

int main(void) {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  char name[128]; CK(cuDeviceGetName(name, sizeof name, dev)); int drv; CK(cuDriverGetVersion(&drv));
  printf("# %s, driver API %d; ns per call, mean over threads (%d calls each)\n", name, drv, N);
  printf("%-8s %-5s %12s %12s %16s %20s\n", "threads", "busy", "EventRecord", "EventQuery", "StreamWaitEvent", "EventCreate+Destroy");
  int counts[] = {1, 4, 16};
  for (int busy = 0; busy < 2; busy++) for (int k = 0; k < 3; k++) {
    int n = counts[k]; pthread_t th[16]; job_t jobs[16];
    pthread_barrier_init(&bar, NULL, n);
    for (int i = 0; i < n; i++) { jobs[i] = (job_t){.id = i, .busy = busy}; pthread_create(&th[i], NULL, worker, &jobs[i]); }
    double r = 0, q = 0, w = 0, c = 0;
    for (int i = 0; i < n; i++) { pthread_join(th[i], NULL); r += jobs[i].rec; q += jobs[i].query; w += jobs[i].wait; c += jobs[i].create; }
    printf("%-8d %-5s %12.0f %12.0f %16.0f %20.0f\n", n, busy ? "yes" : "no", r / n, q / n, w / n, c / n);
    pthread_barrier_destroy(&bar);
  }
  // cuMemAlloc for scale.
  double a = now(); CUdeviceptr p; CK(cuMemAlloc(&p, 32u << 20)); double b = now(); CK(cuMemFree(p)); double c = now();
  printf("# cuMemAlloc(32 MiB) %.0f ns, cuMemFree %.0f ns\n", b - a, c - b);
  return 0;
}
