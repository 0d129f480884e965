/* The machine's f32 FMA rate right now: twelve independent AVX2 FMA chains on each of N threads at
 * once, no memory touched. Prints GFLOP/s for all threads together. On a VM whose vCPUs share a
 * physical core with another tenant's work this moves from run to run, and with it every CPU
 * figure; bench/support/machine.exs prints it beside the load average.
 *
 *   cc -O2 -mavx2 -mfma -pthread fma_probe.c -o fma_probe && ./fma_probe 2
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 40000000L

static void *chains(void *out) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  __m256 a[12];
  for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps(1.0f);
  for (long i = 0; i < ITERS; i++) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
  }
  __m256 s = _mm256_setzero_ps();
  for (int j = 0; j < 12; j++) s = _mm256_add_ps(s, a[j]);
  _mm256_storeu_ps((float *)out, s);
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1;
  if (n < 1 || n > 1024) return 2;
  pthread_t *t = calloc(n, sizeof *t);
  float(*out)[8] = calloc(n, sizeof *out);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, chains, out[i]);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  printf("%.1f %g\n", (double)n * ITERS * 12 * 16 / s / 1e9, out[0][0]);
  return 0;
}
