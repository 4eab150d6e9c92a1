/*
 * What each size is held against.
 *  - Error: every rank regenerates all ranks' inputs for its share of the result (the
 *    streams are counter-based, perf_dtype.h) and compares with an fp64 reduction in rank
 *    order; rank 0 merges the shares. Allreduce and allgather results are split evenly
 *    between the ranks; a reducescatter rank checks its own part.
 *  - Divergence: each rank hashes its result in fixed chunks and rank 0 compares the hashes
 *    with its own; only chunks whose hashes differ travel to rank 0, which compares them
 *    element by element. An element counts once however many ranks disagree on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_coll.h"

#define PERF_CHECK_BLOCK 1024 /* elements regenerated per rank at a time */
#define PERF_HASH_CHUNK (64u << 10) /* a multiple of every element size */

static void perf_coll_error_reduce(const perf_coll_opts* o, const perf_coll_plan* p,
                                   const uint8_t* recv, size_t out_first, uint64_t in_first,
                                   size_t count, perf_err* e) {
  int n = p->nranks;
  double* vals = malloc(sizeof(double) * PERF_CHECK_BLOCK * (size_t)n);
  double* col = malloc(sizeof(double) * (size_t)n);
  if (vals == NULL || col == NULL) {
    fprintf(stderr, "agoq-perf: out of memory for the reference\n");
    e->nonfinite += count; /* counted as wrong rather than silently skipped */
    free(vals);
    free(col);
    return;
  }
  for (size_t base = 0; base < count; base += PERF_CHECK_BLOCK) {
    size_t m = count - base < PERF_CHECK_BLOCK ? count - base : PERF_CHECK_BLOCK;
    for (int k = 0; k < n; k++)
      perf_input_values(p->dtype, perf_rank_seed(o->seed, k), n, in_first + base, m,
                        vals + (size_t)k * PERF_CHECK_BLOCK);
    for (size_t i = 0; i < m; i++) {
      for (int k = 0; k < n; k++) col[k] = vals[(size_t)k * PERF_CHECK_BLOCK + i];
      perf_err_add(e, perf_elem_get(p->dtype, recv, out_first + base + i),
                   perf_reduce_f64(p->op, col, n));
    }
  }
  free(vals);
  free(col);
}

void perf_coll_error(const perf_coll_opts* o, const perf_coll_plan* p, const uint8_t* recv,
                     perf_err* e) {
  memset(e, 0, sizeof(*e));
  size_t n = (size_t)p->nranks, r = (size_t)p->rank;
  size_t lo = p->count * r / n, hi = p->count * (r + 1) / n;
  switch (p->kind) {
    case PERF_COLL_ALLREDUCE:
      perf_coll_error_reduce(o, p, recv, lo, lo, hi - lo, e);
      return;
    case PERF_COLL_REDUCESCATTER:
      perf_coll_error_reduce(o, p, recv, 0, r * p->per_rank, p->per_rank, e);
      return;
    default: {
      /* Element g of the output is element g % per of rank g / per's input. */
      double vals[PERF_CHECK_BLOCK];
      size_t g = lo;
      while (g < hi) {
        size_t src = g / p->per_rank, idx = g % p->per_rank;
        size_t m = p->per_rank - idx;
        if (m > hi - g) m = hi - g;
        if (m > PERF_CHECK_BLOCK) m = PERF_CHECK_BLOCK;
        perf_input_values(p->dtype, perf_rank_seed(o->seed, (int)src), p->nranks, idx, m, vals);
        for (size_t i = 0; i < m; i++)
          perf_err_add(e, perf_elem_get(p->dtype, recv, g + i), vals[i]);
        g += m;
      }
      return;
    }
  }
}

/* Marks elements of chunk c where `theirs` differs from `mine`; returns how many were new. */
static int64_t perf_coll_mark(const perf_coll_plan* p, size_t c, const uint8_t* mine,
                              const uint8_t* theirs, size_t len, uint8_t* marks) {
  int64_t fresh = 0;
  size_t first = c * PERF_HASH_CHUNK / p->elt;
  for (size_t i = 0; i < len / p->elt; i++) {
    if (memcmp(mine + i * p->elt, theirs + i * p->elt, p->elt) == 0) continue;
    size_t g = first + i;
    if (!(marks[g / 8] & (1u << (g % 8)))) {
      marks[g / 8] |= (uint8_t)(1u << (g % 8));
      fresh++;
    }
  }
  return fresh;
}

int perf_coll_diverged(perf_group* g, const perf_coll_plan* p, const uint8_t* recv,
                       int64_t* diverged) {
  *diverged = -1;
  if (p->kind == PERF_COLL_REDUCESCATTER) return 0;
  *diverged = 0;
  size_t nchunks = (p->bytes + PERF_HASH_CHUNK - 1) / PERF_HASH_CHUNK;
  if (nchunks == 0) return 0;
  if (nchunks * 8 * (size_t)g->nranks > UINT32_MAX) {
    fprintf(stderr, "agoq-perf: %zu B is too large to compare between ranks\n", p->bytes);
    return -1;
  }
  int rc = -1;
  uint64_t* mine = malloc(nchunks * 8);
  uint64_t* all = g->rank == 0 ? malloc(nchunks * 8 * (size_t)g->nranks) : NULL;
  uint32_t* list = malloc(nchunks * 4);
  uint8_t* chunk = malloc(PERF_HASH_CHUNK);
  uint8_t* marks = NULL;
  if (mine == NULL || list == NULL || chunk == NULL || (g->rank == 0 && all == NULL)) {
    fprintf(stderr, "agoq-perf: out of memory comparing results\n");
    goto out;
  }
  for (size_t c = 0; c < nchunks; c++) {
    size_t len = p->bytes - c * PERF_HASH_CHUNK < PERF_HASH_CHUNK ? p->bytes - c * PERF_HASH_CHUNK
                                                                  : PERF_HASH_CHUNK;
    mine[c] = perf_hash64(recv + c * PERF_HASH_CHUNK, len, c);
  }
  if (perf_group_gather(g, mine, all, (uint32_t)(nchunks * 8), 600000) != 0) goto out;
  /* Rank 0 asks each rank for the chunks whose hashes differ from its own. */
  for (int k = 1; k < g->nranks; k++) {
    if (g->rank != 0 && g->rank != k) continue;
    uint32_t nlist = 0;
    if (g->rank == 0) {
      for (size_t c = 0; c < nchunks; c++)
        if (all[(size_t)k * nchunks + c] != mine[c]) list[nlist++] = (uint32_t)c;
      if (perf_group_send_to(g, k, &nlist, 4) != 0 ||
          (nlist > 0 && perf_group_send_to(g, k, list, nlist * 4) != 0))
        goto out;
    } else if (perf_group_recv_from(g, 0, &nlist, 4, 600000) != 0 || nlist > nchunks ||
               (nlist > 0 && perf_group_recv_from(g, 0, list, nlist * 4, 600000) != 0)) {
      goto out;
    }
    for (uint32_t j = 0; j < nlist; j++) {
      size_t c = list[j];
      if (c >= nchunks) goto out;
      size_t off = c * PERF_HASH_CHUNK;
      size_t len = p->bytes - off < PERF_HASH_CHUNK ? p->bytes - off : PERF_HASH_CHUNK;
      if (g->rank != 0) {
        if (perf_group_send_to(g, 0, recv + off, (uint32_t)len) != 0) goto out;
        continue;
      }
      if (perf_group_recv_from(g, k, chunk, (uint32_t)len, 600000) != 0) goto out;
      if (marks == NULL && (marks = calloc(p->count / 8 + 1, 1)) == NULL) {
        fprintf(stderr, "agoq-perf: out of memory comparing results\n");
        goto out;
      }
      *diverged += perf_coll_mark(p, c, recv + off, chunk, len, marks);
    }
  }
  rc = 0;
out:
  free(mine);
  free(all);
  free(list);
  free(chunk);
  free(marks);
  return rc;
}
