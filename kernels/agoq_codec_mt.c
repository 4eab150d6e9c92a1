/*
 * Multi-threaded codec calls: the same block-range workers as the single-threaded driver,
 * over pieces of whole bitmap words (64 blocks), so the bits are the same by construction.
 *
 * A small persistent pool, created on first use, helps whoever calls. The caller always
 * works on its own job too, so a call completes even when every pool thread is busy with
 * other callers' jobs (the transport's progress threads may call concurrently): helpers only
 * ever speed a job up. Pieces are claimed with an atomic counter; a job lives on its
 * caller's stack and the caller leaves only when no helper is still inside it.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "agoq_codec_internal.h"

#define AGOQ_MT_MAX_THREADS 64
#define AGOQ_MT_MAX_PIECES 256
/* Below this many elements per piece the hand-off costs more than it saves. */
#define AGOQ_MT_MIN_PIECE_ELEMS 32768u

typedef struct agoq_mt_job {
  void (*run)(void* ctx, size_t piece);
  void* ctx;
  size_t npieces;
  atomic_size_t next; /* next unclaimed piece */
  int want;           /* helpers wanted */
  int joined;         /* helpers that took the job (pool lock) */
  int active;         /* helpers still inside the job (pool lock) */
  bool queued;        /* on the pool's queue (pool lock) */
  struct agoq_mt_job* next_job;
} agoq_mt_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* a job was queued, or stop */
  pthread_cond_t done_cv; /* a helper left a job */
  agoq_mt_job* head;
  pthread_t threads[AGOQ_MT_MAX_THREADS];
  int nthreads;
  bool stop;
  bool atfork_registered;
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};

static void job_dequeue(agoq_mt_job* job) {
  for (agoq_mt_job** pp = &pool.head; *pp != NULL; pp = &(*pp)->next_job) {
    if (*pp == job) {
      *pp = job->next_job;
      job->queued = false;
      return;
    }
  }
}

static void job_work(agoq_mt_job* job) {
  agoq_fpenv env; /* the caller's and the helpers' environments alike */
  agoq_fpenv_enter(&env);
  size_t i;
  while ((i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < job->npieces)
    job->run(job->ctx, i);
  agoq_fpenv_leave(&env);
}

static void* pool_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (!pool.stop && pool.head == NULL) pthread_cond_wait(&pool.work_cv, &pool.mu);
    if (pool.stop) break;
    agoq_mt_job* job = pool.head;
    if (atomic_load_explicit(&job->next, memory_order_relaxed) >= job->npieces) {
      job_dequeue(job); /* nothing left to claim: the caller finishes on its own */
      continue;
    }
    job->joined++;
    job->active++;
    if (job->joined >= job->want) job_dequeue(job);
    pthread_mutex_unlock(&pool.mu);
    job_work(job);
    pthread_mutex_lock(&pool.mu);
    if (job->queued) job_dequeue(job);
    if (--job->active == 0) pthread_cond_broadcast(&pool.done_cv);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* The child of a fork has only the forking thread: forget the helpers (their jobs belonged
 * to threads that do not exist there) and start over lazily. */
static void pool_atfork_child(void) {
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.work_cv, NULL);
  pthread_cond_init(&pool.done_cv, NULL);
  pool.head = NULL;
  pool.nthreads = 0;
  pool.stop = false;
}

/* At exit or unload of the library that holds this code, the helpers must not outlive it. */
__attribute__((destructor)) static void pool_shutdown(void) {
  pthread_mutex_lock(&pool.mu);
  pool.stop = true;
  int n = pool.nthreads;
  pool.nthreads = 0;
  pthread_cond_broadcast(&pool.work_cv);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < n; i++) pthread_join(pool.threads[i], NULL);
}

/* Grows the pool to `want` helpers (pool lock held). A failure to start one leaves fewer
 * helpers, which only costs speed. */
static void pool_grow(int want) {
  if (pool.stop) return;
  if (!pool.atfork_registered) {
    if (pthread_atfork(NULL, NULL, pool_atfork_child) != 0) return;
    pool.atfork_registered = true;
  }
  if (want > AGOQ_MT_MAX_THREADS) want = AGOQ_MT_MAX_THREADS;
  if (pool.nthreads >= want) return;
  /* Helpers take no signals: those belong to the application's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (pool.nthreads < want) {
    if (pthread_create(&pool.threads[pool.nthreads], NULL, pool_main, NULL) != 0) break;
    pthread_setname_np(pool.threads[pool.nthreads], "agoq-codec");
    pool.nthreads++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* sysconf reads /sys on every call: once is enough (the pool does not follow hot-plug). */
static int online_cpus(void) {
  static atomic_int cached = 0;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    v = n < 1 ? 1 : n > AGOQ_MT_MAX_THREADS + 1 ? AGOQ_MT_MAX_THREADS + 1 : (int)n;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
  }
  return v;
}

/* Runs run(ctx, 0..npieces-1) with up to nthreads threads, the caller included. */
static void mt_run(void (*run)(void*, size_t), void* ctx, size_t npieces, int nthreads) {
  agoq_mt_job job;
  memset(&job, 0, sizeof job);
  job.run = run;
  job.ctx = ctx;
  job.npieces = npieces;
  atomic_init(&job.next, 0);
  /* More helpers than CPUs would only take turns with the caller. */
  int helpers = online_cpus() - 1;
  job.want = nthreads - 1 < helpers ? nthreads - 1 : helpers;
  if (job.want < 0) job.want = 0;
  if ((size_t)job.want > npieces - 1) job.want = (int)(npieces - 1);
  if (job.want > 0) {
    pthread_mutex_lock(&pool.mu);
    pool_grow(job.want);
    if (pool.nthreads > 0) {
      job.queued = true;
      job.next_job = NULL;
      agoq_mt_job** tail = &pool.head;
      while (*tail != NULL) tail = &(*tail)->next_job;
      *tail = &job;
      pthread_cond_broadcast(&pool.work_cv);
    }
    pthread_mutex_unlock(&pool.mu);
  }
  job_work(&job);
  if (job.want > 0) {
    pthread_mutex_lock(&pool.mu);
    if (job.queued) job_dequeue(&job);
    while (job.active > 0) pthread_cond_wait(&pool.done_cv, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
  }
}

/* ---- splitting ------------------------------------------------------------------------------- */

typedef struct {
  agoq_codec_layout lay;
  const void* src;
  void* dst;
  agoq_dtype out;
  size_t piece_blocks;
  size_t npieces;
  size_t count[AGOQ_MT_MAX_PIECES]; /* escaped blocks per piece, then the prefix before it */
} mt_ctx;

static int resolve_threads(int nthreads) {
  return nthreads == 0 ? online_cpus() : nthreads;
}

/* Pieces of whole bitmap words, about four per thread for balance, each big enough to pay
 * for its hand-off, and never more than AGOQ_MT_MAX_PIECES. */
static void mt_split(mt_ctx* c, int nthreads) {
  size_t nb = c->lay.nb;
  size_t per = nb / ((size_t)nthreads * 4) + 1;
  size_t min_blocks = AGOQ_MT_MIN_PIECE_ELEMS / c->lay.p.block;
  size_t cap_blocks = nb / AGOQ_MT_MAX_PIECES + 1;
  if (per < min_blocks) per = min_blocks;
  if (per < cap_blocks) per = cap_blocks;
  per = (per + 63) & ~(size_t)63;
  c->piece_blocks = per;
  c->npieces = nb / per + (nb % per != 0);
}

static void piece_range(const mt_ctx* c, size_t i, size_t* b0, size_t* b1) {
  *b0 = i * c->piece_blocks;
  *b1 = *b0 + c->piece_blocks < c->lay.nb ? *b0 + c->piece_blocks : c->lay.nb;
}

static void run_quantize(void* arg, size_t i) {
  mt_ctx* c = arg;
  size_t b0, b1;
  piece_range(c, i, &b0, &b1);
  c->count[i] = agoq_codec_quantize_blocks(&c->lay, c->src, b0, b1);
}

static void run_copy_raw(void* arg, size_t i) {
  mt_ctx* c = arg;
  size_t b0, b1;
  piece_range(c, i, &b0, &b1);
  agoq_codec_copy_raw(&c->lay, c->src, b0, b1, c->count[i]);
}

static void run_decode(void* arg, size_t i) {
  mt_ctx* c = arg;
  size_t b0, b1;
  piece_range(c, i, &b0, &b1);
  agoq_codec_decode_blocks(&c->lay, b0, b1, c->count[i], c->out, c->dst);
}

static void run_decode_acc(void* arg, size_t i) {
  mt_ctx* c = arg;
  size_t b0, b1;
  piece_range(c, i, &b0, &b1);
  agoq_codec_decode_acc_blocks(&c->lay, b0, b1, c->count[i], c->dst);
}

/* count[i] := escaped blocks before piece i, from the bitmap (pieces start on words). */
static void prefix_from_bitmap(mt_ctx* c) {
  size_t before = 0, w = 0;
  for (size_t i = 0; i < c->npieces; i++) {
    size_t b0, b1;
    piece_range(c, i, &b0, &b1);
    for (; w < b0 / 64; w++) {
      uint64_t word;
      memcpy(&word, c->lay.bitmap + 8 * w, sizeof word);
      before += (size_t)__builtin_popcountll(word);
    }
    c->count[i] = before;
  }
}

agoq_codec_status agoq_quantize_mt(const agoq_codec_params* p, const void* src, size_t n, void* body,
                                   size_t cap, size_t* body_len, size_t* escaped_blocks, int nthreads) {
  if (nthreads < 0) return AGOQ_CODEC_EARG;
  agoq_codec_status st = agoq_codec_quantize_check(p, src, n, body, body_len);
  if (st != AGOQ_CODEC_OK) return st;
  nthreads = resolve_threads(nthreads);
  if (nthreads == 1 || p->format == AGOQ_FORMAT_NONE)
    return agoq_quantize(p, src, n, body, cap, body_len, escaped_blocks);
  mt_ctx c;
  if (!agoq_codec_layout_init(&c.lay, p, n)) return AGOQ_CODEC_EARG;
  mt_split(&c, nthreads);
  if (c.npieces < 2) return agoq_quantize(p, src, n, body, cap, body_len, escaped_blocks);
  size_t head = agoq_codec_layout_size(&c.lay, 0);
  if (head == SIZE_MAX) return AGOQ_CODEC_EARG;
  if (cap < head || body == NULL) return AGOQ_CODEC_ESPACE;
  agoq_codec_layout_attach(&c.lay, body);
  c.src = src;
  memset(c.lay.bitmap, 0, c.lay.bitmap_bytes);
  mt_run(run_quantize, &c, c.npieces, nthreads);
  size_t escaped = 0;
  for (size_t i = 0; i < c.npieces; i++) {
    size_t k = c.count[i];
    c.count[i] = escaped;
    escaped += k;
  }
  size_t total = agoq_codec_layout_size(&c.lay, escaped);
  if (total == SIZE_MAX) return AGOQ_CODEC_EARG;
  if (total > cap) return AGOQ_CODEC_ESPACE;
  if (escaped) mt_run(run_copy_raw, &c, c.npieces, nthreads);
  *body_len = total;
  if (escaped_blocks) *escaped_blocks = escaped;
  return AGOQ_CODEC_OK;
}

/* Shared by both decode entry points: validates and splits, or says to go single-threaded. */
static agoq_codec_status decode_prepare(mt_ctx* c, const agoq_codec_params* p, const void* body,
                                        size_t body_len, size_t n, int nthreads, bool* split) {
  size_t escaped;
  *split = false;
  agoq_codec_status st = agoq_codec_body_check(p, body, body_len, n, &c->lay, &escaped);
  if (st != AGOQ_CODEC_OK || n == 0) return st;
  mt_split(c, nthreads);
  if (c->npieces < 2) return AGOQ_CODEC_OK;
  prefix_from_bitmap(c);
  *split = true;
  return AGOQ_CODEC_OK;
}

agoq_codec_status agoq_dequantize_mt(const agoq_codec_params* p, const void* body, size_t body_len,
                                     size_t n, agoq_dtype out, void* dst, int nthreads) {
  if (nthreads < 0) return AGOQ_CODEC_EARG;
  nthreads = resolve_threads(nthreads);
  if (nthreads == 1 || agoq_codec_decode_check(p, body, body_len, n, dst) != AGOQ_CODEC_OK ||
      p->format == AGOQ_FORMAT_NONE || (unsigned)out >= AGOQ_DTYPE_COUNT)
    return agoq_dequantize(p, body, body_len, n, out, dst);
  mt_ctx c;
  bool split;
  agoq_codec_status st = decode_prepare(&c, p, body, body_len, n, nthreads, &split);
  if (st != AGOQ_CODEC_OK || n == 0) return st;
  if (!split) {
    agoq_codec_decode_blocks(&c.lay, 0, c.lay.nb, 0, out, dst);
    return AGOQ_CODEC_OK;
  }
  c.out = out;
  c.dst = dst;
  mt_run(run_decode, &c, c.npieces, nthreads);
  return AGOQ_CODEC_OK;
}

agoq_codec_status agoq_dequantize_accumulate_mt(const agoq_codec_params* p, const void* body,
                                                size_t body_len, size_t n, float* acc, int nthreads) {
  if (nthreads < 0) return AGOQ_CODEC_EARG;
  nthreads = resolve_threads(nthreads);
  if (nthreads == 1 || agoq_codec_decode_check(p, body, body_len, n, acc) != AGOQ_CODEC_OK ||
      p->format == AGOQ_FORMAT_NONE)
    return agoq_dequantize_accumulate(p, body, body_len, n, acc);
  mt_ctx c;
  bool split;
  agoq_codec_status st = decode_prepare(&c, p, body, body_len, n, nthreads, &split);
  if (st != AGOQ_CODEC_OK || n == 0) return st;
  if (!split) {
    agoq_codec_decode_acc_blocks(&c.lay, 0, c.lay.nb, 0, acc);
    return AGOQ_CODEC_OK;
  }
  c.dst = acc;
  mt_run(run_decode_acc, &c, c.npieces, nthreads);
  return AGOQ_CODEC_OK;
}
