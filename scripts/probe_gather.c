// Gather throughput on one core (the lattice i-quant tiles' lookup): indices from an L1 array, 4
// independent gathers a loop, tables in L1. Measured 2026-11-26 on the H100 machine (Sapphire
// Rapids, 2.64 GHz by a dependent-add loop): 0.17-0.20 ns an element for every zmm/ymm form
// (vpgatherqq/dq zmm 1.5-1.6 ns for 8 elements, vpgatherdd zmm 2.7 ns for 16), scalar loads
// 0.25 ns: about 2 elements a cycle. A lattice code is one element per 8 weights (IQ3: per 4).
// gcc -O3 -march=sapphirerapids probe_gather.c -o p && ./p
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static uint64_t g64[2048] __attribute__((aligned(64)));
static int32_t i32s[64 * 16] __attribute__((aligned(64)));
static int64_t i64s[64 * 8] __attribute__((aligned(64)));
static volatile long long sink;
#define N 5000000L
int main(void) {
  for (int i = 0; i < 2048; i++) g64[i] = 0x0123456789abcdefULL * (i + 1);
  srand(3);
  for (int i = 0; i < 64 * 16; i++) i32s[i] = rand() % 256;
  for (int i = 0; i < 64 * 8; i++) i64s[i] = rand() % 256;
  for (int rep = 0; rep < 2; rep++) {
  { __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0; double t = now();
    for (long i = 0; i < N; i++) { const int64_t *p = i64s + 32 * (i & 15);
      a0 = _mm512_xor_si512(a0, _mm512_i64gather_epi64(_mm512_load_si512(p), (const long long *)g64, 8));
      a1 = _mm512_xor_si512(a1, _mm512_i64gather_epi64(_mm512_load_si512(p + 8), (const long long *)g64, 8));
      a2 = _mm512_xor_si512(a2, _mm512_i64gather_epi64(_mm512_load_si512(p + 16), (const long long *)g64, 8));
      a3 = _mm512_xor_si512(a3, _mm512_i64gather_epi64(_mm512_load_si512(p + 24), (const long long *)g64, 8)); }
    t = now() - t; sink = _mm512_reduce_add_epi64(a0 ^ a1 ^ a2 ^ a3);
    printf("vpgatherqq zmm (8 x u64, i64 idx)   %6.3f ns/gather  %6.3f ns/element\n", 1e9 * t / (4 * N), 1e9 * t / (32 * N)); }
  { __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0; double t = now();
    for (long i = 0; i < N; i++) { const int32_t *p = i32s + 32 * (i & 15);
      a0 = _mm512_xor_si512(a0, _mm512_i32gather_epi64(_mm256_load_si256((const __m256i *)p), (const long long *)g64, 8));
      a1 = _mm512_xor_si512(a1, _mm512_i32gather_epi64(_mm256_load_si256((const __m256i *)(p + 8)), (const long long *)g64, 8));
      a2 = _mm512_xor_si512(a2, _mm512_i32gather_epi64(_mm256_load_si256((const __m256i *)(p + 16)), (const long long *)g64, 8));
      a3 = _mm512_xor_si512(a3, _mm512_i32gather_epi64(_mm256_load_si256((const __m256i *)(p + 24)), (const long long *)g64, 8)); }
    t = now() - t; sink = _mm512_reduce_add_epi64(a0 ^ a1 ^ a2 ^ a3);
    printf("vpgatherdq zmm (8 x u64, i32 idx)   %6.3f ns/gather  %6.3f ns/element\n", 1e9 * t / (4 * N), 1e9 * t / (32 * N)); }
  { __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0; double t = now();
    for (long i = 0; i < N; i++) { const int32_t *p = i32s + 64 * (i & 15);
      a0 = _mm512_xor_si512(a0, _mm512_i32gather_epi32(_mm512_load_si512(p), (const int *)g64, 4));
      a1 = _mm512_xor_si512(a1, _mm512_i32gather_epi32(_mm512_load_si512(p + 16), (const int *)g64, 4));
      a2 = _mm512_xor_si512(a2, _mm512_i32gather_epi32(_mm512_load_si512(p + 32), (const int *)g64, 4));
      a3 = _mm512_xor_si512(a3, _mm512_i32gather_epi32(_mm512_load_si512(p + 48), (const int *)g64, 4)); }
    t = now() - t; sink = _mm512_reduce_add_epi64(a0 ^ a1 ^ a2 ^ a3);
    printf("vpgatherdd zmm (16 x u32, i32 idx)  %6.3f ns/gather  %6.3f ns/element\n", 1e9 * t / (4 * N), 1e9 * t / (64 * N)); }
  { __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0; double t = now();
    for (long i = 0; i < N; i++) { const int32_t *p = i32s + 32 * (i & 15);
      a0 = _mm256_xor_si256(a0, _mm256_i32gather_epi32((const int *)g64, _mm256_load_si256((const __m256i *)p), 4));
      a1 = _mm256_xor_si256(a1, _mm256_i32gather_epi32((const int *)g64, _mm256_load_si256((const __m256i *)(p + 8)), 4));
      a2 = _mm256_xor_si256(a2, _mm256_i32gather_epi32((const int *)g64, _mm256_load_si256((const __m256i *)(p + 16)), 4));
      a3 = _mm256_xor_si256(a3, _mm256_i32gather_epi32((const int *)g64, _mm256_load_si256((const __m256i *)(p + 24)), 4)); }
    t = now() - t; sink = _mm256_extract_epi64(a0 ^ a1 ^ a2 ^ a3, 0);
    printf("vpgatherdd ymm (8 x u32)            %6.3f ns/gather  %6.3f ns/element\n", 1e9 * t / (4 * N), 1e9 * t / (32 * N)); }
  { __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0; double t = now();
    for (long i = 0; i < N; i++) { const int32_t *p = i32s + 16 * (i & 15);
      a0 = _mm256_xor_si256(a0, _mm256_i32gather_epi64((const long long *)g64, _mm_load_si128((const __m128i *)p), 8));
      a1 = _mm256_xor_si256(a1, _mm256_i32gather_epi64((const long long *)g64, _mm_load_si128((const __m128i *)(p + 4)), 8));
      a2 = _mm256_xor_si256(a2, _mm256_i32gather_epi64((const long long *)g64, _mm_load_si128((const __m128i *)(p + 8)), 8));
      a3 = _mm256_xor_si256(a3, _mm256_i32gather_epi64((const long long *)g64, _mm_load_si128((const __m128i *)(p + 12)), 8)); }
    t = now() - t; sink = _mm256_extract_epi64(a0 ^ a1 ^ a2 ^ a3, 0);
    printf("vpgatherdq ymm (4 x u64)            %6.3f ns/gather  %6.3f ns/element\n", 1e9 * t / (4 * N), 1e9 * t / (16 * N)); }
  { uint64_t acc = 0; double t = now();
    for (long i = 0; i < N; i++) { const int32_t *p = i32s + 32 * (i & 15);
      for (int k = 0; k < 32; k++) acc ^= g64[p[k]]; }
    t = now() - t; sink = acc;
    printf("scalar loads (idx load + table load) %6.3f ns/element\n", 1e9 * t / (32 * N)); }
  }
  return 0;
}
