/* Port attributes, the NCCL_IB_HCA filter and the sysfs reads of the verbs transport
 * (the GID choice is in agoq_ibport_gid.c). */
#include "agoq_ibport.h"
#include "agoq_ibport_text.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Port attributes --------------------------------------------------------------- */

typedef struct {
  uint32_t code;
  int lane_mbps;
  const char* name;
} agoq_ib_speed_row;

/* libibverbs' IBV_SPEED_* codes: one bit each, so an unknown value never aliases. */
static const agoq_ib_speed_row agoq_ib_speeds[] = {
    {1, 2500, "SDR"},    {2, 5000, "DDR"},    {4, 10000, "QDR"},   {8, 10000, "FDR10"},   {16, 14000, "FDR"},
    {32, 25000, "EDR"},  {64, 50000, "HDR"},  {128, 100000, "NDR"}, {256, 200000, "XDR"},
};

static const agoq_ib_speed_row* agoq_ib_speed_find(int active_speed, uint32_t active_speed_ex) {
  /* active_speed is a u8 in ibv_port_attr and cannot hold XDR: rdma-core added
   * active_speed_ex for it, so that one wins whenever the library filled it in. */
  uint32_t code = active_speed_ex != 0 ? active_speed_ex : (active_speed > 0 ? (uint32_t)active_speed : 0);
  for (size_t i = 0; i < sizeof agoq_ib_speeds / sizeof agoq_ib_speeds[0]; i++)
    if (agoq_ib_speeds[i].code == code) return &agoq_ib_speeds[i];
  return NULL;
}

int agoq_ib_width_lanes(int active_width) {
  switch (active_width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

int agoq_ib_speed_mbps(int active_speed, uint32_t active_speed_ex, int active_width) {
  const agoq_ib_speed_row* row = agoq_ib_speed_find(active_speed, active_speed_ex);
  int lanes = agoq_ib_width_lanes(active_width);
  if (row == NULL || lanes == 0) return 0;
  return row->lane_mbps * lanes; /* at most 200000 * 12: fits an int */
}

int agoq_ib_mtu_bytes(int mtu_enum) {
  if (mtu_enum < 1 || mtu_enum > 5) return 0;
  return 128 << mtu_enum;
}

const char* agoq_ib_link_layer_name(int link_layer) {
  /* "IB" and "RoCE" as NCCL's "NET/IB : Using [0]mlx5_0:1/RoCE" line says them. */
  switch (link_layer) {
    case AGOQ_IB_LINK_LAYER_UNSPECIFIED: return "unspecified";
    case AGOQ_IB_LINK_LAYER_INFINIBAND: return "IB";
    case AGOQ_IB_LINK_LAYER_ETHERNET: return "RoCE";
    default: return "unknown";
  }
}

const char* agoq_ib_port_state_name(int state) {
  switch (state) {
    case 0: return "NOP";
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
    default: return "unknown";
  }
}

const char* agoq_ib_gid_type_name(agoq_ib_gid_type t) {
  switch (t) {
    case AGOQ_IB_GID_TYPE_IB: return "IB";
    case AGOQ_IB_GID_TYPE_ROCE_V1: return "RoCE v1";
    case AGOQ_IB_GID_TYPE_ROCE_V2: return "RoCE v2";
    case AGOQ_IB_GID_TYPE_UNKNOWN: return "unknown";
  }
  return "unknown"; /* a value outside the enum, copied from elsewhere */
}

const char* agoq_ib_width_name(int active_width) {
  switch (active_width) {
    case 1: return "1x";
    case 2: return "4x";
    case 4: return "8x";
    case 8: return "12x";
    case 16: return "2x";
    default: return "unknown";
  }
}

const char* agoq_ib_speed_name(int active_speed, uint32_t active_speed_ex) {
  const agoq_ib_speed_row* row = agoq_ib_speed_find(active_speed, active_speed_ex);
  return row != NULL ? row->name : "unknown";
}

bool agoq_ib_port_usable(const agoq_ib_port_info* port, char* why, size_t why_len) {
  if (why != NULL && why_len > 0) why[0] = '\0';
  if (port == NULL) {
    if (why != NULL && why_len > 0) snprintf(why, why_len, "no port");
    return false;
  }
  if (port->state != AGOQ_IB_PORT_STATE_ACTIVE) {
    if (why != NULL && why_len > 0)
      snprintf(why, why_len, "%.63s:%d is %s (state %d), not ACTIVE", port->dev, port->port,
               agoq_ib_port_state_name(port->state), port->state);
    return false;
  }
  if (port->link_layer != AGOQ_IB_LINK_LAYER_INFINIBAND && port->link_layer != AGOQ_IB_LINK_LAYER_ETHERNET) {
    if (why != NULL && why_len > 0)
      snprintf(why, why_len, "%.63s:%d has link layer %s (%d), neither InfiniBand nor Ethernet", port->dev,
               port->port, agoq_ib_link_layer_name(port->link_layer), port->link_layer);
    return false;
  }
  return true;
}

/* ---- HCA filter -------------------------------------------------------------------- */

void agoq_ib_text_add(agoq_ib_text* t, const char* fmt, ...) {
  char* at = t->p != NULL && t->len < t->n ? t->p + t->len : NULL;
  size_t room = at != NULL ? t->n - t->len : 0;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(at, room, fmt, ap);
  va_end(ap);
  if (w > 0) t->len += (size_t)w;
}

static void agoq_ib_err(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void agoq_ib_err(char* err, size_t errlen, const char* fmt, ...) {
  if (err == NULL || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Parses one entry [begin, end) into e. */
static int agoq_ib_hca_entry_parse(const char* begin, const char* end, int pos, agoq_ib_hca_filter_entry* e,
                                   char* err, size_t errlen) {
  int len = (int)(end - begin);
  if (len == 0) {
    agoq_ib_err(err, errlen, "empty entry #%d (two commas, or a comma at either end)", pos);
    return -1;
  }
  const char* colon = memchr(begin, ':', (size_t)len);
  const char* name_end = colon != NULL ? colon : end;
  int name_len = (int)(name_end - begin);
  if (name_len == 0) {
    agoq_ib_err(err, errlen, "entry #%d '%.*s' has no device name before ':'", pos, len, begin);
    return -1;
  }
  if (name_len >= AGOQ_IB_HCA_NAME_MAX) {
    agoq_ib_err(err, errlen, "device name in entry #%d '%.20s...' is %d bytes, at most %d", pos, begin, name_len,
                AGOQ_IB_HCA_NAME_MAX - 1);
    return -1;
  }
  for (const char* c = begin; c < name_end; c++) {
    /* NCCL would keep these in the name, where they can never match a device. */
    if (isspace((unsigned char)*c)) {
      agoq_ib_err(err, errlen, "entry #%d '%.*s' contains whitespace; device names have none", pos, len, begin);
      return -1;
    }
    if (*c == '^' || *c == '=') {
      agoq_ib_err(err, errlen, "'%c' in entry #%d '%.*s': '^' and '=' go once, at the start of the list (as '^=')",
                  *c, pos, len, begin);
      return -1;
    }
  }
  memcpy(e->name, begin, (size_t)name_len);
  e->name[name_len] = '\0';
  e->port = -1;
  if (colon == NULL) return 0;
  const char* d = colon + 1;
  long port = 0;
  int digits = 0;
  while (d < end && *d >= '0' && *d <= '9') {
    if (port <= 255) port = port * 10 + (*d - '0'); /* stop growing: no overflow */
    d++;
    digits++;
  }
  if (digits == 0) {
    agoq_ib_err(err, errlen, "port in entry #%d '%.*s' is not a positive integer", pos, len, begin);
    return -1;
  }
  if (d < end) {
    agoq_ib_err(err, errlen, "trailing garbage '%.*s' after the port in entry #%d '%.*s'", (int)(end - d), d, pos,
                len, begin);
    return -1;
  }
  if (port < 1 || port > 255) {
    agoq_ib_err(err, errlen, "port in entry #%d '%.*s' is not a positive integer up to 255", pos, len, begin);
    return -1;
  }
  e->port = (int)port;
  return 0;
}

int agoq_ib_hca_filter_parse(const char* spec, agoq_ib_hca_filter* out, char* err, size_t errlen) {
  if (err != NULL && errlen > 0) err[0] = '\0';
  if (out == NULL) {
    agoq_ib_err(err, errlen, "no filter to fill");
    return -1;
  }
  memset(out, 0, sizeof *out);
  if (spec == NULL || spec[0] == '\0') return 0;
  const char* s = spec;
  if (*s == '^') {
    out->exclude = true;
    s++;
  }
  if (*s == '=') {
    out->exact = true;
    s++;
  }
  if (*s == '\0') {
    /* NCCL reads "^" as "exclude everything": surely not what anyone meant. */
    agoq_ib_err(err, errlen, "'%s' has no device after the '^'/'=' prefix", spec);
    return -1;
  }
  int pos = 1;
  for (;;) {
    const char* comma = strchr(s, ',');
    const char* end = comma != NULL ? comma : s + strlen(s);
    if (out->count == AGOQ_IB_HCA_FILTER_MAX) {
      agoq_ib_err(err, errlen, "more than %d entries", AGOQ_IB_HCA_FILTER_MAX);
      memset(out, 0, sizeof *out);
      return -1;
    }
    if (agoq_ib_hca_entry_parse(s, end, pos, &out->entries[out->count], err, errlen) != 0) {
      memset(out, 0, sizeof *out);
      return -1;
    }
    out->count++;
    if (comma == NULL) break;
    s = comma + 1;
    pos++;
  }
  return 0;
}

static bool agoq_ib_hca_name_match(const agoq_ib_hca_filter_entry* e, const char* dev, bool exact) {
  /* NCCL's matchIf: the entry's length as a prefix, or with its NUL when exact. */
  size_t n = strnlen(e->name, sizeof e->name);
  if (exact) return strlen(dev) == n && strncmp(dev, e->name, n) == 0;
  return strncmp(dev, e->name, n) == 0;
}

static int agoq_ib_hca_find(const agoq_ib_hca_filter* f, const char* dev, int port) {
  int count = f->count < 0 ? 0 : (f->count > AGOQ_IB_HCA_FILTER_MAX ? AGOQ_IB_HCA_FILTER_MAX : f->count);
  for (int i = 0; i < count; i++) {
    const agoq_ib_hca_filter_entry* e = &f->entries[i];
    if (agoq_ib_hca_name_match(e, dev, f->exact) && (e->port == -1 || port == -1 || e->port == port)) return i;
  }
  return -1;
}

bool agoq_ib_hca_filter_match(const agoq_ib_hca_filter* f, const char* dev, int port) {
  if (f == NULL || f->count <= 0) return true;
  if (dev == NULL) dev = "";
  bool listed = agoq_ib_hca_find(f, dev, port) >= 0;
  return listed != f->exclude;
}

static void agoq_ib_hca_entry_text(agoq_ib_text* t, const agoq_ib_hca_filter_entry* e) {
  agoq_ib_text_add(t, "%.*s", (int)strnlen(e->name, sizeof e->name), e->name);
  if (e->port != -1) agoq_ib_text_add(t, ":%d", e->port);
}

static void agoq_ib_hca_prefix_text(agoq_ib_text* t, const agoq_ib_hca_filter* f) {
  agoq_ib_text_add(t, "%s%s", f->exclude ? "^" : "", f->exact ? "=" : "");
}

static void agoq_ib_hca_list_text(agoq_ib_text* t, const agoq_ib_hca_filter* f) {
  int count = f->count > AGOQ_IB_HCA_FILTER_MAX ? AGOQ_IB_HCA_FILTER_MAX : f->count;
  agoq_ib_hca_prefix_text(t, f);
  for (int i = 0; i < count; i++) {
    if (i > 0) agoq_ib_text_add(t, ",");
    agoq_ib_hca_entry_text(t, &f->entries[i]);
  }
}

int agoq_ib_hca_filter_describe(const agoq_ib_hca_filter* f, const char* dev, int port, char* out, size_t n) {
  agoq_ib_text t = {out, n, 0};
  if (out != NULL && n > 0) out[0] = '\0';
  if (f == NULL || f->count <= 0) {
    agoq_ib_text_add(&t, "no filter: every port is used");
    return 1;
  }
  if (dev == NULL) dev = "";
  int hit = agoq_ib_hca_find(f, dev, port);
  bool used = (hit >= 0) != f->exclude;
  if (hit >= 0) {
    const agoq_ib_hca_filter_entry* e = &f->entries[hit];
    agoq_ib_text_add(&t, "%s '", f->exclude ? "excluded by" : "matches");
    agoq_ib_hca_prefix_text(&t, f);
    agoq_ib_hca_entry_text(&t, e);
    agoq_ib_text_add(&t, "'");
    int name_len = (int)strnlen(e->name, sizeof e->name);
    if (f->exact) {
      agoq_ib_text_add(&t, " exactly");
    } else if (strlen(dev) != (size_t)name_len) {
      /* The pitfall: say it where the user reads which port was taken. */
      agoq_ib_text_add(&t, " by prefix (use '%s=%.*s' to match whole names only)", f->exclude ? "^" : "", name_len,
                       e->name);
    }
    return used ? 1 : 0;
  }
  agoq_ib_text_add(&t, "%s '", f->exclude ? "not excluded by" : "not in the list");
  agoq_ib_hca_list_text(&t, f);
  agoq_ib_text_add(&t, "'");
  /* A device that is listed for other ports only: say so, it looks like a match. */
  if (port != -1 && agoq_ib_hca_find(f, dev, -1) >= 0) agoq_ib_text_add(&t, " (listed for other ports, not %d)", port);
  return used ? 1 : 0;
}

/* ---- sysfs ------------------------------------------------------------------------- */

/* A device name from ibv_get_device_name is one path component; anything else would
 * read outside the class directory. */
static bool agoq_ib_dev_name_ok(const char* dev) {
  return dev[0] != '\0' && strchr(dev, '/') == NULL && strcmp(dev, ".") != 0 && strcmp(dev, "..") != 0;
}

int agoq_ib_sysfs_gid_type(const char* sysfs_root, const char* dev, int port, int index, agoq_ib_gid_type* out) {
  if (out == NULL) return EFAULT;
  *out = AGOQ_IB_GID_TYPE_UNKNOWN;
  if (sysfs_root == NULL || dev == NULL) return EFAULT;
  if (!agoq_ib_dev_name_ok(dev)) return ENODEV;
  if (port < 1 || index < 0) return ERANGE;
  char path[PATH_MAX];
  int w = snprintf(path, sizeof path, "%s/class/infiniband/%s/ports/%d/gid_attrs/types/%d", sysfs_root, dev, port,
                   index);
  if (w < 0 || (size_t)w >= sizeof path) return ENAMETOOLONG;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[64];
  ssize_t r;
  do {
    r = read(fd, buf, sizeof buf - 1);
  } while (r < 0 && errno == EINTR);
  int read_errno = r < 0 ? errno : 0;
  close(fd);
  if (r < 0) return read_errno; /* EINVAL: containers, and empty slots on some kernels */
  buf[r] = '\0';
  size_t len = (size_t)r;
  while (len > 0 && isspace((unsigned char)buf[len - 1])) buf[--len] = '\0';
  if (len == 0) return ENODATA;
  if (strcmp(buf, "RoCE v2") == 0) {
    *out = AGOQ_IB_GID_TYPE_ROCE_V2;
  } else if (strcmp(buf, "IB/RoCE v1") == 0 || strcmp(buf, "RoCE v1") == 0) {
    *out = AGOQ_IB_GID_TYPE_ROCE_V1;
  } else if (strcmp(buf, "IB") == 0) {
    *out = AGOQ_IB_GID_TYPE_IB;
  } else {
    return EPROTO;
  }
  return 0;
}

/* "dddd:bb:dd.f" (hex digits): the form of a PCI function's directory. */
static bool agoq_ib_is_pci_bdf(const char* s) {
  static const char form[] = "xxxx:xx:xx.x";
  if (strlen(s) != sizeof form - 1) return false;
  for (size_t i = 0; i < sizeof form - 1; i++) {
    if (form[i] == 'x' ? !isxdigit((unsigned char)s[i]) : s[i] != form[i]) return false;
  }
  return true;
}

int agoq_ib_sysfs_pci_path(const char* sysfs_root, const char* dev, char* out, size_t n) {
  if (out != NULL && n > 0) out[0] = '\0';
  if (sysfs_root == NULL || dev == NULL || out == NULL) return EFAULT;
  if (!agoq_ib_dev_name_ok(dev)) return ENODEV;
  char path[PATH_MAX];
  int w = snprintf(path, sizeof path, "%s/class/infiniband/%s/device", sysfs_root, dev);
  if (w < 0 || (size_t)w >= sizeof path) return ENAMETOOLONG;
  char real[PATH_MAX];
  if (realpath(path, real) == NULL) return errno;
  size_t len = strlen(real);
  if (len + 1 > n) return ENAMETOOLONG;
  const char* slash = strrchr(real, '/');
  const char* last = slash != NULL ? slash + 1 : real;
  /* NCCL zeroes the last character blindly; only a PCI function digit is zeroed here, so
   * a virtual device's path is not bent into one that does not exist. */
  if (agoq_ib_is_pci_bdf(last)) real[len - 1] = '0';
  memcpy(out, real, len + 1);
  return 0;
}
