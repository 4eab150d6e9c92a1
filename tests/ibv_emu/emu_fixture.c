/*
 * Fixture files: the devices, ports and GID tables of the emulated machine.
 *
 *   device <name> [guid=0x...] [max_qp=N] [max_qp_wr=N] [max_cqe=N] [dmabuf=yes|no]
 *   port <num> [state=active|down|init|armed] [link=ib|eth] [mtu=256|...|4096]
 *              [width=1x|2x|4x|8x|12x] [speed=sdr|ddr|qdr|fdr10|fdr|edr|hdr|ndr] [lid=N]
 *   gid <index> <ipv6 text, IPv4 as ::ffff:a.b.c.d> [type=ib|roce-v1|roce-v2|unreadable]
 *
 * One directive a line; '#' starts a comment. port lines belong to the latest device and
 * must number its ports 1, 2, ...; gid lines belong to the latest port. Unlisted GID
 * indexes up to the highest listed are all-zero. Defaults: port active, link ib, mtu 4096,
 * width 4x, speed hdr, lid = 1 + 16 * device index + port - 1 on IB (0 on Ethernet);
 * a gid's type defaults to ib on IB and roce-v2 on Ethernet; an IB port without gid lines
 * gets GID 0 = fe80::<guid>. Without AGOQ_IBV_EMU_FIXTURE the machine is one device emu0
 * with that default port 1.
 * Any error: the one line "agoq-ibv-emu: <file>:<line>: <what>" on stderr, and EINVAL.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

static uint64_t name_guid(const char* name, int idx) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char* p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return 0x0002c90300000000ull | ((h ^ (uint64_t)idx) & 0xffffffffull);
}

static void default_port(emu_port_cfg* p, int dev_idx, int port_num) {
  memset(p, 0, sizeof *p);
  p->state = AGOQ_IBV_PORT_ACTIVE;
  p->link = AGOQ_IBV_LINK_LAYER_INFINIBAND;
  p->mtu = AGOQ_IBV_MTU_4096;
  p->width = 2;  /* 4x */
  p->speed = 64; /* HDR */
  p->lid = (uint16_t)(1 + 16 * dev_idx + port_num - 1);
}

static void default_gid(emu_port_cfg* p, uint64_t guid) {
  if (p->ngid || p->link != AGOQ_IBV_LINK_LAYER_INFINIBAND) return;
  p->ngid = 1;
  p->gids[0].gid.raw[0] = 0xfe;
  p->gids[0].gid.raw[1] = 0x80;
  for (int i = 0; i < 8; i++) p->gids[0].gid.raw[8 + i] = (uint8_t)(guid >> (56 - 8 * i));
  p->gids[0].type = AGOQ_IBV_GID_TYPE_IB;
}

static void default_device(emu_dev_cfg* d, const char* name, int idx) {
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->guid = name_guid(name, idx);
  d->max_qp = 1024;
  d->max_qp_wr = 8192;
  d->max_cqe = 65536;
  d->dmabuf = 1;
}

typedef struct {
  const char* word;
  int value;
} kv;

static int lookup(const kv* t, const char* s, int* out) {
  for (; t->word; t++)
    if (!strcmp(t->word, s)) {
      *out = t->value;
      return 0;
    }
  return -1;
}

static const kv k_state[] = {{"active", AGOQ_IBV_PORT_ACTIVE}, {"down", AGOQ_IBV_PORT_DOWN},
                             {"init", AGOQ_IBV_PORT_INIT},     {"armed", AGOQ_IBV_PORT_ARMED},
                             {NULL, 0}};
static const kv k_link[] = {{"ib", AGOQ_IBV_LINK_LAYER_INFINIBAND}, {"eth", AGOQ_IBV_LINK_LAYER_ETHERNET}, {NULL, 0}};
static const kv k_mtu[] = {{"256", AGOQ_IBV_MTU_256},   {"512", AGOQ_IBV_MTU_512},   {"1024", AGOQ_IBV_MTU_1024},
                           {"2048", AGOQ_IBV_MTU_2048}, {"4096", AGOQ_IBV_MTU_4096}, {NULL, 0}};
/* ibv_port_attr.active_width / active_speed encodings (verbs.h, ibv_query_port(3)) */
static const kv k_width[] = {{"1x", 1}, {"4x", 2}, {"8x", 4}, {"12x", 8}, {"2x", 16}, {NULL, 0}};
static const kv k_speed[] = {{"sdr", 1}, {"ddr", 2},  {"qdr", 4},  {"fdr10", 8}, {"fdr", 16},
                             {"edr", 32}, {"hdr", 64}, {"ndr", 128}, {NULL, 0}};
static const kv k_gidtype[] = {{"ib", AGOQ_IBV_GID_TYPE_IB},
                               {"roce-v1", AGOQ_IBV_GID_TYPE_ROCE_V1},
                               {"roce-v2", AGOQ_IBV_GID_TYPE_ROCE_V2},
                               {"unreadable", -1},
                               {NULL, 0}};

static int parse_num(const char* s, unsigned long long max, unsigned long long* out) {
  if (!*s) return -1;
  char* end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end || errno || v > max) return -1;
  *out = v;
  return 0;
}

#define FAIL(...)                                                          \
  do {                                                                     \
    char what_[160];                                                       \
    snprintf(what_, sizeof what_, __VA_ARGS__);                            \
    fprintf(stderr, "agoq-ibv-emu: %s:%d: %s\n", file, lineno, what_);     \
    fclose(f);                                                             \
    return EINVAL;                                                         \
  } while (0)

int emu_fixture_load(emu_dev_cfg* devs, int* ndev) {
  const char* file = getenv("AGOQ_IBV_EMU_FIXTURE");
  if (!file || !*file) {
    default_device(&devs[0], "emu0", 0);
    devs[0].nports = 1;
    default_port(&devs[0].ports[0], 0, 1);
    default_gid(&devs[0].ports[0], devs[0].guid);
    *ndev = 1;
    return 0;
  }
  int lineno = 0;
  FILE* f = fopen(file, "r");
  if (!f) {
    int e = errno;
    fprintf(stderr, "agoq-ibv-emu: %s:0: cannot open: %s\n", file, strerror(e));
    return EINVAL;
  }
  int n = 0;
  emu_dev_cfg* d = NULL;
  emu_port_cfg* port = NULL;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char* hash = strchr(line, '#');
    if (hash) *hash = 0;
    char* tok[16];
    int nt = 0;
    char* save = NULL;
    for (char* t = strtok_r(line, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save)) {
      if (nt == 16) FAIL("too many words");
      tok[nt++] = t;
    }
    if (nt == 0) continue;
    if (!strcmp(tok[0], "device")) {
      if (nt < 2) FAIL("device: missing name");
      if (n == EMU_MAX_DEV) FAIL("more than %d devices", EMU_MAX_DEV);
      if (strlen(tok[1]) >= AGOQ_IBV_SYSFS_NAME_MAX) FAIL("device name too long");
      for (int i = 0; i < n; i++)
        if (!strcmp(devs[i].name, tok[1])) FAIL("duplicate device '%s'", tok[1]);
      d = &devs[n];
      default_device(d, tok[1], n);
      n++;
      port = NULL;
      for (int i = 2; i < nt; i++) {
        char* eq = strchr(tok[i], '=');
        if (!eq) FAIL("expected key=value, got '%s'", tok[i]);
        *eq = 0;
        const char* v = eq + 1;
        unsigned long long u;
        if (!strcmp(tok[i], "guid")) {
          if (parse_num(v, ~0ull, &u)) FAIL("bad guid '%s'", v);
          d->guid = u;
        } else if (!strcmp(tok[i], "max_qp") || !strcmp(tok[i], "max_qp_wr") || !strcmp(tok[i], "max_cqe")) {
          if (parse_num(v, 1u << 24, &u) || u == 0) FAIL("bad %s '%s'", tok[i], v);
          int* dst = !strcmp(tok[i], "max_qp") ? &d->max_qp : !strcmp(tok[i], "max_qp_wr") ? &d->max_qp_wr : &d->max_cqe;
          *dst = (int)u;
        } else if (!strcmp(tok[i], "dmabuf")) {
          if (strcmp(v, "yes") && strcmp(v, "no")) FAIL("dmabuf must be yes or no, got '%s'", v);
          d->dmabuf = !strcmp(v, "yes");
        } else {
          FAIL("device: unknown key '%s'", tok[i]);
        }
      }
    } else if (!strcmp(tok[0], "port")) {
      unsigned long long num;
      if (!d) FAIL("port before any device");
      if (nt < 2 || parse_num(tok[1], EMU_MAX_PORT, &num) || num == 0) FAIL("port: bad number");
      if ((int)num != d->nports + 1) FAIL("port %llu: ports must be numbered 1, 2, ... in order", num);
      port = &d->ports[num - 1];
      d->nports = (int)num;
      default_port(port, n - 1, (int)num);
      int lid_given = 0;
      for (int i = 2; i < nt; i++) {
        char* eq = strchr(tok[i], '=');
        if (!eq) FAIL("expected key=value, got '%s'", tok[i]);
        *eq = 0;
        const char* v = eq + 1;
        int val;
        unsigned long long u;
        if (!strcmp(tok[i], "state")) {
          if (lookup(k_state, v, &val)) FAIL("bad state '%s'", v);
          port->state = val;
        } else if (!strcmp(tok[i], "link")) {
          if (lookup(k_link, v, &val)) FAIL("bad link '%s'", v);
          port->link = val;
        } else if (!strcmp(tok[i], "mtu")) {
          if (lookup(k_mtu, v, &val)) FAIL("bad mtu '%s'", v);
          port->mtu = val;
        } else if (!strcmp(tok[i], "width")) {
          if (lookup(k_width, v, &val)) FAIL("bad width '%s'", v);
          port->width = val;
        } else if (!strcmp(tok[i], "speed")) {
          if (lookup(k_speed, v, &val)) FAIL("bad speed '%s'", v);
          port->speed = val;
        } else if (!strcmp(tok[i], "lid")) {
          if (parse_num(v, 0xffff, &u)) FAIL("bad lid '%s'", v);
          port->lid = (uint16_t)u;
          lid_given = 1;
        } else {
          FAIL("port: unknown key '%s'", tok[i]);
        }
      }
      if (port->link == AGOQ_IBV_LINK_LAYER_ETHERNET && !lid_given) port->lid = 0;
    } else if (!strcmp(tok[0], "gid")) {
      unsigned long long idx;
      if (!port) FAIL("gid before any port");
      if (nt < 3 || parse_num(tok[1], EMU_MAX_GID - 1, &idx)) FAIL("gid: bad index (0..%d)", EMU_MAX_GID - 1);
      emu_gid* g = &port->gids[idx];
      if (inet_pton(AF_INET6, tok[2], g->gid.raw) != 1) FAIL("gid: bad address '%s'", tok[2]);
      g->type = port->link == AGOQ_IBV_LINK_LAYER_ETHERNET ? AGOQ_IBV_GID_TYPE_ROCE_V2 : AGOQ_IBV_GID_TYPE_IB;
      for (int i = 3; i < nt; i++) {
        int val;
        if (strncmp(tok[i], "type=", 5) || lookup(k_gidtype, tok[i] + 5, &val)) FAIL("gid: bad '%s'", tok[i]);
        if (val < 0)
          g->unreadable = 1;
        else
          g->type = val;
      }
      if ((int)idx + 1 > port->ngid) port->ngid = (int)idx + 1;
    } else {
      FAIL("unknown directive '%s'", tok[0]);
    }
  }
  fclose(f);
  if (n == 0) {
    fprintf(stderr, "agoq-ibv-emu: %s:%d: no device\n", file, lineno);
    return EINVAL;
  }
  for (int i = 0; i < n; i++) {
    if (devs[i].nports == 0) {
      fprintf(stderr, "agoq-ibv-emu: %s:%d: device %s has no port\n", file, lineno, devs[i].name);
      return EINVAL;
    }
    for (int p = 0; p < devs[i].nports; p++) default_gid(&devs[i].ports[p], devs[i].guid);
  }
  *ndev = n;
  return 0;
}
