/*
 * Protection domains and memory regions.
 *
 * An MR covers [addr, addr + length) of this process; work requests address it, through
 * its lkey (local) or rkey (remote), in its iova space [iova, iova + length): "the virtual
 * base address of the MR when accessed through a lkey or rkey" (ibv_reg_mr(3); iova = addr
 * for ibv_reg_mr).
 *
 * ibv_reg_dmabuf_mr registers bytes [offset, offset + length) of a dma-buf file at iova; the
 * process may have no CPU mapping of them at all (GPU memory). The emulation maps that range
 * of the file for itself, as the HCA's DMA reaches the pages and not the process's view: a
 * CUDA-emulation allocation exported as a file (agoq_emu_dmabuf_export) is then written and
 * read here while the address the plugin holds stays inaccessible to the CPU. As in
 * rdma-core, the MR's addr is the offset. The fd may be closed once the call returns.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu.h"

EMU_EXPORT struct agoq_ibv_pd* ibv_alloc_pd(struct agoq_ibv_context* ibctx) {
  if (!ibctx) {
    errno = EINVAL;
    return NULL;
  }
  emu_ctx* ctx = (emu_ctx*)ibctx;
  emu_pd* pd = calloc(1, sizeof *pd);
  if (!pd) {
    errno = ENOMEM;
    return NULL;
  }
  pd->ibv.context = ibctx;
  pthread_mutex_lock(&ctx->lock);
  pd->ibv.handle = ctx->next_handle++;
  pd->next = ctx->pds;
  ctx->pds = pd;
  pthread_mutex_unlock(&ctx->lock);
  return &pd->ibv;
}

/* ibv_dealloc_pd(3): fails with EBUSY while MRs or QPs still belong to the PD. */
EMU_EXPORT int ibv_dealloc_pd(struct agoq_ibv_pd* ibpd) {
  if (!ibpd) return errno = EINVAL;
  emu_ctx* ctx = (emu_ctx*)ibpd->context;
  emu_pd* pd = (emu_pd*)ibpd;
  pthread_mutex_lock(&ctx->lock);
  if (pd->nmr || pd->nqp) {
    pthread_mutex_unlock(&ctx->lock);
    return errno = EBUSY;
  }
  for (emu_pd** pp = &ctx->pds; *pp; pp = &(*pp)->next)
    if (*pp == pd) {
      *pp = pd->next;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  free(pd);
  return 0;
}

enum {
  ACCESS_KNOWN = AGOQ_IBV_ACCESS_LOCAL_WRITE | AGOQ_IBV_ACCESS_REMOTE_WRITE | AGOQ_IBV_ACCESS_REMOTE_READ |
                 AGOQ_IBV_ACCESS_REMOTE_ATOMIC | (1 << 4) /* MW_BIND */,
  ACCESS_OPTIONAL_FIRST = AGOQ_IBV_ACCESS_RELAXED_ORDERING,
};

static struct agoq_ibv_mr* reg_common(struct agoq_ibv_pd* ibpd, void* addr, size_t length, uint64_t iova,
                                      unsigned int access, uint8_t* bytes) {
  if (!ibpd) {
    errno = EINVAL;
    return NULL;
  }
  /* ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then
   * IBV_ACCESS_LOCAL_WRITE must be set too" (IB spec C10-87); a zero length is invalid, as
   * are unknown access bits below the optional range. */
  if (length == 0 || (access & (ACCESS_OPTIONAL_FIRST - 1) & ~(unsigned)ACCESS_KNOWN) ||
      ((access & (AGOQ_IBV_ACCESS_REMOTE_WRITE | AGOQ_IBV_ACCESS_REMOTE_ATOMIC)) &&
       !(access & AGOQ_IBV_ACCESS_LOCAL_WRITE))) {
    errno = EINVAL;
    return NULL;
  }
  if (!bytes) {
    errno = EFAULT; /* pinning address 0 fails in the kernel */
    return NULL;
  }
  pthread_mutex_lock(&emu_g.lock);
  int enomem = emu_g.f_reg_enomem;
  int frozen = emu_g.f_reg_freeze_n && emu_g.send_count >= emu_g.f_reg_freeze_n;
  uint32_t c = ++emu_g.key_counter;
  uint64_t r = emu_random();
  pthread_mutex_unlock(&emu_g.lock);
  if (enomem) { /* injected: what RLIMIT_MEMLOCK makes the kernel return */
    errno = ENOMEM;
    return NULL;
  }
  if (frozen) { /* injected: a registration on the data path is a test failure */
    fprintf(stderr, "agoq-ibv-emu: ibv_reg_mr of %zu bytes after %llu send WRs (reg_mr_freeze)\n", length,
            (unsigned long long)emu_g.f_reg_freeze_n);
    errno = EPERM;
    return NULL;
  }
  emu_mr* mr = calloc(1, sizeof *mr);
  if (!mr) {
    errno = ENOMEM;
    return NULL;
  }
  emu_ctx* ctx = (emu_ctx*)ibpd->context;
  /* keys: a per-process counter in the low 23 bits keeps them unique, random high bits
   * make stale keys unlikely to hit; bit 23 distinguishes lkey from rkey */
  mr->ibv.lkey = ((uint32_t)r & 0xff000000u) | (c & 0x7fffffu);
  mr->ibv.rkey = ((uint32_t)(r >> 32) & 0xff000000u) | 0x800000u | (c & 0x7fffffu);
  mr->ibv.context = ibpd->context;
  mr->ibv.pd = ibpd;
  mr->ibv.addr = addr;
  mr->ibv.length = length;
  mr->iova = iova;
  mr->bytes = bytes;
  mr->access = access;
  pthread_mutex_lock(&ctx->lock);
  mr->ibv.handle = ctx->next_handle++;
  ((emu_pd*)ibpd)->nmr++;
  mr->next = ctx->mrs;
  ctx->mrs = mr;
  pthread_mutex_unlock(&ctx->lock);
  return &mr->ibv;
}

EMU_EXPORT struct agoq_ibv_mr* ibv_reg_mr(struct agoq_ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_common(pd, addr, length, (uint64_t)(uintptr_t)addr, (unsigned int)access, addr);
}

EMU_EXPORT struct agoq_ibv_mr* ibv_reg_mr_iova2(struct agoq_ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                                unsigned int access) {
  return reg_common(pd, addr, length, iova, access, addr);
}

/* ibv_reg_dmabuf_mr(3). A device without dma-buf support answers EOPNOTSUPP whatever the
 * fd (what a plugin's probe with fd -1 distinguishes from EBADF). An fd that is no file is
 * EBADF; a range past the file's end, EINVAL. */
EMU_EXPORT struct agoq_ibv_mr* ibv_reg_dmabuf_mr(struct agoq_ibv_pd* pd, uint64_t offset, size_t length,
                                                 uint64_t iova, int fd, int access) {
  if (!pd) {
    errno = EINVAL;
    return NULL;
  }
  if (!((emu_ctx*)pd->context)->dev.cfg.dmabuf) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    errno = EBADF;
    return NULL;
  }
  if (length == 0 || offset > (uint64_t)st.st_size || length > (uint64_t)st.st_size - offset) {
    errno = EINVAL;
    return NULL;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint64_t first = offset / page * page;
  size_t map_len = (size_t)(offset - first) + length;
  void* map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)first);
  if (map == MAP_FAILED) {
    errno = errno == EACCES ? EACCES : EINVAL;
    return NULL;
  }
  struct agoq_ibv_mr* ibmr =
      reg_common(pd, (void*)(uintptr_t)offset, length, iova, (unsigned int)access, (uint8_t*)map + (offset - first));
  if (!ibmr) {
    int e = errno;
    munmap(map, map_len);
    errno = e;
    return NULL;
  }
  emu_mr* mr = (emu_mr*)ibmr;
  mr->map = map;
  mr->map_len = map_len;
  return ibmr;
}

static void mr_free(emu_mr* mr) {
  if (mr->map) munmap(mr->map, mr->map_len);
  free(mr);
}

EMU_EXPORT int ibv_dereg_mr(struct agoq_ibv_mr* ibmr) {
  if (!ibmr) return errno = EINVAL;
  emu_ctx* ctx = (emu_ctx*)ibmr->context;
  emu_mr* mr = (emu_mr*)ibmr;
  pthread_mutex_lock(&ctx->lock);
  for (emu_mr** pp = &ctx->mrs; *pp; pp = &(*pp)->next)
    if (*pp == mr) {
      *pp = mr->next;
      break;
    }
  ((emu_pd*)ibmr->pd)->nmr--;
  pthread_mutex_unlock(&ctx->lock);
  mr_free(mr);
  return 0;
}

emu_mr* emu_mr_check(emu_ctx* ctx, struct agoq_ibv_pd* pd, uint32_t key, int remote, uint64_t addr, uint64_t len,
                     unsigned int need, uint8_t** ptr) {
  for (emu_mr* mr = ctx->mrs; mr; mr = mr->next) {
    if ((remote ? mr->ibv.rkey : mr->ibv.lkey) != key) continue;
    if (mr->ibv.pd != pd) return NULL; /* IB spec o10-36: the key must belong to the QP's PD */
    if ((mr->access & need) != need) return NULL;
    uint64_t base = mr->iova; /* lkey and rkey alike */
    /* the whole range must lie inside the region (a 0-byte access at its end is fine) */
    if (addr < base || len > mr->ibv.length || addr - base > mr->ibv.length - len) return NULL;
    *ptr = mr->bytes + (addr - base);
    return mr;
  }
  return NULL;
}

void emu_mem_free_all(emu_ctx* ctx) {
  while (ctx->mrs) {
    emu_mr* m = ctx->mrs;
    ctx->mrs = m->next;
    mr_free(m);
  }
  while (ctx->pds) {
    emu_pd* p = ctx->pds;
    ctx->pds = p->next;
    free(p);
  }
}
