/* Memory registrations of the verbs transport, shared and counted per device.
 *
 * Registering is slow on hardware (the kernel pins and maps every page; tens of
 * microseconds to milliseconds per call) and an HCA holds a limited number of regions, so
 * registrations are made at setup, never per message: NCCL's regMr, the net core's staging
 * buffers and a connection's rings come here once and hand their key to the transfers that
 * use them. NCCL registers the same buffer on several communicators and channels, so a
 * range already inside a live registration of the device takes a reference on it instead
 * of a second one (NCCL's own IB transport caches the same way). A registration lives
 * exactly as long as its references: nothing is kept after the last one goes, so no region
 * ever outlives the memory its holder freed.
 *
 * A transfer without a key (a caller that did not register) takes a reference for the
 * message alone: correct, and counted, so that the close line shows the cost. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

#define AGOQ_IB_MR_MAGIC 0x524d4241u /* "ABMR" */

/* Registrations are rare (setup only), so one lock serves every device. */
static pthread_mutex_t agoq_ib_mr_mu = PTHREAD_MUTEX_INITIALIZER;

static uintptr_t agoq_ib_page(void) {
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? (uintptr_t)page : 4096;
}

bool agoq_ib_mr_covers(const agoq_ib_mr* m, const void* addr, size_t size) {
  uintptr_t a = (uintptr_t)addr;
  return m != NULL && m->magic == AGOQ_IB_MR_MAGIC && a >= m->start && a <= m->end && size <= m->end - a;
}

/* What a registration is to cover: whole pages of host memory, or bytes [offset, offset +
 * (end - start)) of dma-buf fd at iova start (GPU memory). */
typedef struct {
  uintptr_t start, end;
  bool dmabuf;
  uint64_t offset;
  int fd;
} agoq_ib_mr_want;

static struct agoq_ibv_mr* agoq_ib_mr_register(agoq_ib_dev* d, const agoq_ib_mr_want* w) {
  /* Every use a region can have here: a send source, a write target, and the target of
   * the reads that flush GPU receives. */
  int access = AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_WRITE | AGOQ_IBV_ACCESS_REMOTE_READ;
  size_t len = (size_t)(w->end - w->start);
  errno = 0;
  struct agoq_ibv_mr* mr = w->dmabuf ? agoq_ib.api.reg_dmabuf_mr(d->pd, w->offset, len, (uint64_t)w->start, w->fd, access)
                                     : agoq_ib.api.reg_mr(d->pd, (void*)w->start, len, access);
  if (mr != NULL) return mr;
  int err = errno;
  if (w->dmabuf)
    AGOQ_WARN("%s: ibv_reg_dmabuf_mr of %zu bytes of GPU memory at %p (fd %d, offset %llu) failed: %s%s", d->describe,
              len, (void*)w->start, w->fd, (unsigned long long)w->offset, strerror(err),
              err == ENOMEM ? " (RLIMIT_MEMLOCK, or the GPU's BAR space exhausted)" : "");
  else
    AGOQ_WARN("%s: ibv_reg_mr of %zu bytes at %p failed: %s%s", d->describe, len, (void*)w->start, strerror(err),
              err == ENOMEM ? " (RLIMIT_MEMLOCK too low? raise it with ulimit -l, or --ulimit memlock=-1 in a "
                              "container)"
                            : "");
  return NULL;
}

/* A reference on a live registration of d covering [a, a + size) (of GPU memory only, for a
 * dma-buf: a host region never covers it), or a new one as w says. */
static ncclResult_t agoq_ib_mr_acquire(agoq_ib_dev* d, uintptr_t a, size_t size, const agoq_ib_mr_want* w,
                                       agoq_ib_mr** out, bool* made) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&agoq_ib_mr_mu);
  for (agoq_ib_mr* m = d->mrs; m != NULL; m = m->next) {
    if ((m->dmabuf || !w->dmabuf) && m->start <= a && a + size <= m->end) {
      m->refs++;
      d->mr_shared++;
      *out = m;
      goto unlock;
    }
  }
  agoq_ib_mr* m = calloc(1, sizeof *m);
  if (m == NULL) {
    res = ncclSystemError;
    AGOQ_WARN("%s: out of memory registering %zu bytes", d->describe, size);
    goto unlock;
  }
  m->mr = agoq_ib_mr_register(d, w);
  if (m->mr == NULL) {
    free(m);
    res = ncclSystemError;
    goto unlock;
  }
  m->magic = AGOQ_IB_MR_MAGIC;
  m->dev = d;
  m->start = w->start;
  m->end = w->end;
  m->dmabuf = w->dmabuf;
  m->refs = 1;
  m->next = d->mrs;
  d->mrs = m;
  d->mr_made++;
  if (made != NULL) *made = true;
  *out = m;
unlock:
  pthread_mutex_unlock(&agoq_ib_mr_mu);
  return res;
}

ncclResult_t agoq_ib_mr_get(agoq_ib_dev* d, void* addr, size_t size, agoq_ib_mr** out, bool* made) {
  *out = NULL;
  if (made != NULL) *made = false;
  uintptr_t page = agoq_ib_page(), a = (uintptr_t)addr;
  if (a == 0 || size > UINTPTR_MAX - a - page) {
    AGOQ_WARN("%s: cannot register %p (%zu bytes): not a valid range", d->describe, addr, size);
    return ncclInvalidUsage;
  }
  /* Whole pages: the kernel pins by the page anyway, and a later buffer on the same pages
   * then finds this registration. A zero-length range still gets its page. */
  agoq_ib_mr_want w = {.start = a / page * page, .end = (a + (size > 0 ? size : 1) + page - 1) / page * page, .fd = -1};
  return agoq_ib_mr_acquire(d, a, size, &w, out, made);
}

ncclResult_t agoq_ib_mr_get_dmabuf(agoq_ib_dev* d, void* addr, size_t size, uint64_t offset, int fd,
                                   agoq_ib_mr** out) {
  *out = NULL;
  uintptr_t a = (uintptr_t)addr;
  if (a == 0 || size == 0 || size > UINTPTR_MAX - a || fd < 0) {
    AGOQ_WARN("%s: cannot register dma-buf fd %d at %p (%zu bytes): not a valid range", d->describe, fd, addr, size);
    return ncclInvalidUsage;
  }
  if (!d->dmabuf) {
    AGOQ_WARN("%s: a dma-buf registration on a device without DMA-BUF support (%s)", d->describe, d->gdr);
    return ncclInvalidUsage;
  }
  /* The same GPU buffer registered again (another channel or communicator) shares it. */
  agoq_ib_mr_want w = {.start = a, .end = a + size, .dmabuf = true, .offset = offset, .fd = fd};
  return agoq_ib_mr_acquire(d, a, size, &w, out, NULL);
}

void agoq_ib_mr_put(agoq_ib_mr* m) {
  if (m == NULL) return;
  pthread_mutex_lock(&agoq_ib_mr_mu);
  if (--m->refs > 0) {
    pthread_mutex_unlock(&agoq_ib_mr_mu);
    return;
  }
  agoq_ib_dev* d = m->dev;
  for (agoq_ib_mr** p = &d->mrs; *p != NULL; p = &(*p)->next) {
    if (*p == m) {
      *p = m->next;
      break;
    }
  }
  pthread_mutex_unlock(&agoq_ib_mr_mu);
  int rc = agoq_ib.api.dereg_mr(m->mr);
  if (rc != 0) AGOQ_WARN("%s: ibv_dereg_mr failed: %s", d->describe, strerror(rc));
  m->magic = 0;
  free(m);
}

void agoq_ib_mr_release_dev(agoq_ib_state* st, agoq_ib_dev* d) {
  int left = 0;
  while (d->mrs != NULL) {
    agoq_ib_mr* m = d->mrs;
    d->mrs = m->next;
    st->api.dereg_mr(m->mr);
    m->magic = 0;
    free(m);
    left++;
  }
  if (left > 0)
    AGOQ_INFO(NCCL_NET | NCCL_REG, "%s: %d memory registrations were still held at unload (released now)",
              d->describe, left);
}

/* ---- the transport's reg/dereg ---------------------------------------------------------- */

/* The device a caller's registration is for, or NULL (logged). */
static agoq_ib_dev* agoq_ib_key_dev(int dev) {
  if (dev >= 0 && dev < agoq_ib.ndevs) return &agoq_ib.devs[dev];
  AGOQ_WARN("register: device %d out of range (%d devices)", dev, agoq_ib.ndevs);
  return NULL;
}

ncclResult_t agoq_ib_reg_key(int dev, void* addr, size_t size, void** key) {
  *key = NULL;
  agoq_ib_dev* d = agoq_ib_key_dev(dev);
  return d != NULL ? agoq_ib_mr_get(d, addr, size, (agoq_ib_mr**)key, NULL) : ncclInternalError;
}

ncclResult_t agoq_ib_reg_dmabuf_key(int dev, void* addr, size_t size, uint64_t offset, int fd, void** key) {
  *key = NULL;
  agoq_ib_dev* d = agoq_ib_key_dev(dev);
  return d != NULL ? agoq_ib_mr_get_dmabuf(d, addr, size, offset, fd, (agoq_ib_mr**)key) : ncclInternalError;
}

void agoq_ib_dereg_key(void* key) {
  agoq_ib_mr* m = key;
  if (m == NULL) return;
  if (m->magic != AGOQ_IB_MR_MAGIC) {
    AGOQ_WARN("deregister: %p is no registration of the verbs transport", key);
    return;
  }
  agoq_ib_mr_put(m);
}

/* ---- one transfer's buffer ---------------------------------------------------------------- */

agoq_ib_mr* agoq_ib_mr_ref(void* key) {
  agoq_ib_mr* m = key;
  if (m == NULL) return NULL;
  pthread_mutex_lock(&agoq_ib_mr_mu);
  if (m->magic == AGOQ_IB_MR_MAGIC) {
    m->refs++;
  } else {
    m = NULL;
  }
  pthread_mutex_unlock(&agoq_ib_mr_mu);
  return m;
}

ncclResult_t agoq_ib_mr_for(agoq_ib_conn* c, agoq_ib_mr* held, void* addr, size_t size, agoq_ib_mr** out) {
  *out = NULL;
  if (held != NULL && agoq_ib_mr_covers(held, addr, size) && held->dev == c->d) {
    *out = held;
    return ncclSuccess;
  }
  agoq_ib_mr_put(held);
  /* A live registration of the device covering it serves (a lookup); otherwise one is
   * made for this message: correct but slow, so counted, and said once per connection. */
  bool made = false;
  ncclResult_t res = agoq_ib_mr_get(c->d, addr, size, out, &made);
  if (res != ncclSuccess) {
    agoq_ib_conn_fail(c, res);
    return res;
  }
  if (made && c->transient_regs++ == 0)
    AGOQ_INFO(NCCL_NET | NCCL_REG,
              "%s: connection %s %s: a buffer (%p, %zu bytes) that nothing registered: registered for this message "
              "(slow on hardware; the caller should register it once)",
              c->d->describe, c->is_send ? "to" : "from", c->peer, addr, size);
  return ncclSuccess;
}
