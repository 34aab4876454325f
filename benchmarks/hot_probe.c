// Host-side ceiling of hot reads: pread vs mmap+memcpy vs mmap+non-temporal copy, T threads,
// each with two 4 MiB destination buffers used in turn (like a bounce ring). Best and mean of
// three passes over the whole (cached) file.
//
//   gcc -O2 -static -pthread -o hot_probe benchmarks/hot_probe.c    (here; run there)
//   cat FILE >/dev/null; cat FILE >/dev/null; ./hot_probe FILE 16 8   (threads to try)
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define CH (4u << 20)
static int fd, mode, T; static size_t size; static const char* map;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx2"))) static void nt_copy(char* d, const char* s, size_t n){
  for(size_t i=0;i+128<=n;i+=128){
    __m256i a=_mm256_loadu_si256((const __m256i*)(s+i)),b=_mm256_loadu_si256((const __m256i*)(s+i+32)),
            c=_mm256_loadu_si256((const __m256i*)(s+i+64)),e=_mm256_loadu_si256((const __m256i*)(s+i+96));
    _mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);
    _mm256_stream_si256((__m256i*)(d+i+64),c);_mm256_stream_si256((__m256i*)(d+i+96),e);}
  _mm_sfence();}
static void* work(void* arg){ long t=(long)arg; char* buf[2]; 
  for(int k=0;k<2;k++){buf[k]=aligned_alloc(4096,CH);memset(buf[k],0,CH);}
  size_t n=(size+CH-1)/CH; int k=0;
  for(size_t i=t;i<n;i+=T,k^=1){ size_t off=i*CH, len=size-off<CH?size-off:CH;
    if(mode==0){ if(pread(fd,buf[k],len,off)!=(ssize_t)len){perror("pread");exit(1);} }
    else if(mode==1) memcpy(buf[k],map+off,len); else nt_copy(buf[k],map+off,len); }
  return NULL;}
int main(int c,char**v){ fd=open(v[1],O_RDONLY); struct stat st; fstat(fd,&st); size=st.st_size;
  const char* names[]={"pread","mmap+memcpy","mmap+nt-copy"};
  for(int ti=2;ti<c;ti++){ T=atoi(v[ti]);
   for(mode=0;mode<3;mode++){ double best=0, sum=0;
    for(int r=0;r<3;r++){ if(mode){map=mmap(NULL,size,PROT_READ,MAP_SHARED,fd,0);}
      pthread_t th[256]; double t0=now();
      for(long t=0;t<T;t++) pthread_create(&th[t],NULL,work,(void*)t);
      for(int t=0;t<T;t++) pthread_join(th[t],NULL);
      double g=size/(now()-t0)/(1<<30); if(g>best)best=g; sum+=g;
      if(mode) munmap((void*)map,size);}
    printf("threads %2d %-14s best %6.2f GiB/s  mean %6.2f\n",T,names[mode],best,sum/3); fflush(stdout);}}
  return 0;}
