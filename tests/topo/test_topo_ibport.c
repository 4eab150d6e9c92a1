/* The verbs transport's hardware-facing rules on plain data: link speed and MTU, the
 * NCCL_IB_HCA filter, the GID choice on tables reproducing reported failures (NVIDIA/nccl
 * #769, #1573, uccl-project/uccl#803) and the two sysfs reads on a fake tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_ibport.h"
#include "topo_tree.h"

#define assert_contains(hay, needle)                                                   \
  do {                                                                                 \
    if (strstr((hay), (needle)) == NULL) fail_msg("'%s' not in '%s'", (needle), (hay)); \
  } while (0)
#define assert_not_contains(hay, needle)                                                   \
  do {                                                                                     \
    if (strstr((hay), (needle)) != NULL) fail_msg("'%s' unexpectedly in '%s'", (needle), (hay)); \
  } while (0)

/* ---- Speeds, MTU, names ------------------------------------------------------------ */

static void test_speed(void** state) {
  (void)state;
  assert_int_equal(agoq_ib_speed_mbps(64, 0, 2), 200000);    /* HDR 4x */
  assert_int_equal(agoq_ib_speed_mbps(128, 0, 2), 400000);   /* NDR 4x */
  assert_int_equal(agoq_ib_speed_mbps(32, 0, 1), 25000);     /* EDR 1x */
  assert_int_equal(agoq_ib_speed_mbps(0, 256, 2), 800000);   /* XDR 4x: only speed_ex holds it */
  assert_int_equal(agoq_ib_speed_mbps(64, 128, 2), 400000);  /* speed_ex wins over active_speed */
  assert_int_equal(agoq_ib_speed_mbps(1, 0, 8), 30000);      /* SDR 12x */
  assert_int_equal(agoq_ib_speed_mbps(16, 0, 16), 28000);    /* FDR 2x */
  assert_int_equal(agoq_ib_speed_mbps(8, 0, 2), 40000);      /* FDR10 4x */
  assert_int_equal(agoq_ib_speed_mbps(4, 0, 4), 80000);      /* QDR 8x */
  assert_int_equal(agoq_ib_speed_mbps(2, 0, 2), 20000);      /* DDR 4x */
  assert_int_equal(agoq_ib_speed_mbps(3, 0, 2), 0);          /* unknown speed code */
  assert_int_equal(agoq_ib_speed_mbps(0, 0, 2), 0);
  assert_int_equal(agoq_ib_speed_mbps(0, 512, 2), 0);
  assert_int_equal(agoq_ib_speed_mbps(-64, 0, 2), 0);
  assert_int_equal(agoq_ib_speed_mbps(64, 0, 3), 0);         /* unknown width code */
  assert_int_equal(agoq_ib_speed_mbps(64, 0, 0), 0);
  assert_int_equal(agoq_ib_width_lanes(8), 12);
  assert_int_equal(agoq_ib_width_lanes(16), 2);
}

static void test_mtu_and_names(void** state) {
  (void)state;
  assert_int_equal(agoq_ib_mtu_bytes(1), 256);
  assert_int_equal(agoq_ib_mtu_bytes(2), 512);
  assert_int_equal(agoq_ib_mtu_bytes(3), 1024);
  assert_int_equal(agoq_ib_mtu_bytes(4), 2048);
  assert_int_equal(agoq_ib_mtu_bytes(5), 4096);
  assert_int_equal(agoq_ib_mtu_bytes(0), 0);
  assert_int_equal(agoq_ib_mtu_bytes(6), 0);
  assert_int_equal(agoq_ib_mtu_bytes(-1), 0);
  assert_string_equal(agoq_ib_port_state_name(4), "ACTIVE");
  assert_string_equal(agoq_ib_port_state_name(1), "DOWN");
  assert_string_equal(agoq_ib_port_state_name(99), "unknown");
  assert_string_equal(agoq_ib_link_layer_name(AGOQ_IB_LINK_LAYER_INFINIBAND), "IB");
  assert_string_equal(agoq_ib_link_layer_name(AGOQ_IB_LINK_LAYER_ETHERNET), "RoCE");
  assert_string_equal(agoq_ib_link_layer_name(0), "unspecified");
  assert_string_equal(agoq_ib_link_layer_name(7), "unknown");
  assert_string_equal(agoq_ib_gid_type_name(AGOQ_IB_GID_TYPE_ROCE_V2), "RoCE v2");
  assert_string_equal(agoq_ib_gid_type_name(AGOQ_IB_GID_TYPE_ROCE_V1), "RoCE v1");
  assert_string_equal(agoq_ib_gid_type_name(AGOQ_IB_GID_TYPE_IB), "IB");
  assert_string_equal(agoq_ib_gid_type_name(AGOQ_IB_GID_TYPE_UNKNOWN), "unknown");
  assert_string_equal(agoq_ib_gid_type_name((agoq_ib_gid_type)42), "unknown");
  assert_string_equal(agoq_ib_width_name(2), "4x");
  assert_string_equal(agoq_ib_width_name(8), "12x");
  assert_string_equal(agoq_ib_width_name(5), "unknown");
  assert_string_equal(agoq_ib_speed_name(64, 0), "HDR");
  assert_string_equal(agoq_ib_speed_name(0, 256), "XDR");
  assert_string_equal(agoq_ib_speed_name(8, 0), "FDR10");
  assert_string_equal(agoq_ib_speed_name(3, 0), "unknown");
}

static void test_port_usable(void** state) {
  (void)state;
  agoq_ib_port_info p = {.dev = "mlx5_0", .port = 1, .state = 4, .link_layer = AGOQ_IB_LINK_LAYER_ETHERNET};
  char why[128];
  assert_true(agoq_ib_port_usable(&p, why, sizeof why));
  assert_string_equal(why, "");
  p.state = 1;
  assert_false(agoq_ib_port_usable(&p, why, sizeof why));
  assert_contains(why, "mlx5_0:1 is DOWN");
  p.state = 4;
  p.link_layer = AGOQ_IB_LINK_LAYER_UNSPECIFIED;
  assert_false(agoq_ib_port_usable(&p, why, sizeof why));
  assert_contains(why, "neither InfiniBand nor Ethernet");
  assert_false(agoq_ib_port_usable(NULL, NULL, 0));
}

/* ---- HCA filter -------------------------------------------------------------------- */

static agoq_ib_hca_filter parse_ok(const char* spec) {
  agoq_ib_hca_filter f;
  char err[256] = "unset";
  if (agoq_ib_hca_filter_parse(spec, &f, err, sizeof err) != 0) fail_msg("'%s' refused: %s", spec, err);
  assert_string_equal(err, "");
  return f;
}

static void parse_bad(const char* spec, const char* message) {
  agoq_ib_hca_filter f;
  char err[256] = "";
  assert_int_equal(agoq_ib_hca_filter_parse(spec, &f, err, sizeof err), -1);
  assert_contains(err, message);
  assert_int_equal(f.count, 0); /* a refused spec leaves no half-filled filter */
}

static void test_hca_no_filter(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok(NULL);
  assert_int_equal(f.count, 0);
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_0", 1));
  f = parse_ok("");
  assert_true(agoq_ib_hca_filter_match(&f, "anything", 7));
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_0", 1, why, sizeof why), 1);
  assert_contains(why, "no filter");
  assert_true(agoq_ib_hca_filter_match(NULL, "mlx5_0", 1));
}

static void test_hca_prefix_pitfall(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok("mlx5_1");
  assert_int_equal(f.count, 1);
  assert_false(f.exclude);
  assert_false(f.exact);
  assert_string_equal(f.entries[0].name, "mlx5_1");
  assert_int_equal(f.entries[0].port, -1);
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_1", 1));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_11", 1)); /* NCCL's semantics, kept */
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_0", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_", 1));
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_11", 1, why, sizeof why), 1);
  assert_contains(why, "matches 'mlx5_1' by prefix");
  assert_contains(why, "'=mlx5_1'");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_1", 1, why, sizeof why), 1);
  assert_string_equal(why, "matches 'mlx5_1'");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_0", 1, why, sizeof why), 0);
  assert_string_equal(why, "not in the list 'mlx5_1'");
}

static void test_hca_exact(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok("=mlx5_1");
  assert_true(f.exact);
  assert_false(f.exclude);
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_1", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_11", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_", 1));
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_1", 2, why, sizeof why), 1);
  assert_string_equal(why, "matches '=mlx5_1' exactly");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_11", 1, why, sizeof why), 0);
  assert_string_equal(why, "not in the list '=mlx5_1'");
}

static void test_hca_exclude(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok("^mlx5_0");
  assert_true(f.exclude);
  assert_false(f.exact);
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_0", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_01", 2)); /* prefix, excluded too */
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_1", 1));
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_0", 1, why, sizeof why), 0);
  assert_string_equal(why, "excluded by '^mlx5_0'");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_01", 1, why, sizeof why), 0);
  assert_contains(why, "excluded by '^mlx5_0' by prefix");
  assert_contains(why, "'^=mlx5_0'");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_1", 1, why, sizeof why), 1);
  assert_string_equal(why, "not excluded by '^mlx5_0'");
}

static void test_hca_exclude_exact_port(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok("^=mlx5_0:1");
  assert_true(f.exclude);
  assert_true(f.exact);
  assert_int_equal(f.entries[0].port, 1);
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_0", 1));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_0", 2));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_01", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_0", -1)); /* the device as a whole is listed */
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_0", 1, why, sizeof why), 0);
  assert_string_equal(why, "excluded by '^=mlx5_0:1' exactly");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_0", 2, why, sizeof why), 1);
  assert_contains(why, "not excluded by '^=mlx5_0:1'");
  assert_contains(why, "listed for other ports, not 2");
}

static void test_hca_ports_and_lists(void** state) {
  (void)state;
  char why[256];
  agoq_ib_hca_filter f = parse_ok("mlx5_0:1,mlx5_2:2,mlx5_4");
  assert_int_equal(f.count, 3);
  assert_int_equal(f.entries[0].port, 1);
  assert_int_equal(f.entries[1].port, 2);
  assert_int_equal(f.entries[2].port, -1);
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_0", 1));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_0", 2));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_2", 2));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_2", 1));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_4", 1));
  assert_true(agoq_ib_hca_filter_match(&f, "mlx5_4", 2));
  assert_false(agoq_ib_hca_filter_match(&f, "mlx5_3", 1));
  assert_false(agoq_ib_hca_filter_match(&f, NULL, 1));
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_3", 1, why, sizeof why), 0);
  assert_string_equal(why, "not in the list 'mlx5_0:1,mlx5_2:2,mlx5_4'");
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_2", 2, why, sizeof why), 1);
  assert_string_equal(why, "matches 'mlx5_2:2'");
  /* Truncation keeps the verdict and the NUL. */
  char tiny[8];
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_3", 1, tiny, sizeof tiny), 0);
  assert_int_equal(strlen(tiny), 7);
  assert_int_equal(agoq_ib_hca_filter_describe(&f, "mlx5_2", 2, NULL, 0), 1);
  /* 32 entries are fine, port 255 too. */
  char spec[32 * 8 + 1] = "";
  for (int i = 0; i < 32; i++) snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%sd%d", i ? "," : "", i);
  f = parse_ok(spec);
  assert_int_equal(f.count, 32);
  f = parse_ok("mlx5_0:255");
  assert_int_equal(f.entries[0].port, 255);
  char name63[80];
  memset(name63, 'n', 63);
  name63[63] = '\0';
  f = parse_ok(name63);
  assert_int_equal(strlen(f.entries[0].name), 63);
}

static void test_hca_malformed(void** state) {
  (void)state;
  parse_bad("mlx5_0,,mlx5_1", "empty entry #2");
  parse_bad(",mlx5_0", "empty entry #1");
  parse_bad("mlx5_0,", "empty entry #2");
  parse_bad("^", "no device after the '^'/'=' prefix");
  parse_bad("^=", "no device after");
  parse_bad("=", "no device after");
  parse_bad(":1", "no device name before ':'");
  parse_bad("mlx5_0:", "port in entry #1 'mlx5_0:' is not a positive integer");
  parse_bad("mlx5_0:x", "is not a positive integer");
  parse_bad("mlx5_0:-1", "is not a positive integer");
  parse_bad("mlx5_0:0", "is not a positive integer up to 255");
  parse_bad("mlx5_0:256", "up to 255");
  parse_bad("mlx5_0:99999999999999999999", "up to 255");
  parse_bad("mlx5_0:1x", "trailing garbage 'x' after the port in entry #1 'mlx5_0:1x'");
  parse_bad("mlx5_0:1:2", "trailing garbage ':2'");
  parse_bad("mlx5_0, mlx5_1", "contains whitespace");
  parse_bad("mlx5_0,^mlx5_1", "'^' and '=' go once, at the start");
  parse_bad("=^mlx5_0", "'^' in entry #1");
  parse_bad("^^mlx5_0", "'^' in entry #1");
  char spec[33 * 8 + 1] = "";
  for (int i = 0; i < 33; i++) snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%sd%d", i ? "," : "", i);
  parse_bad(spec, "more than 32 entries");
  char name64[80];
  memset(name64, 'n', 64);
  name64[64] = '\0';
  parse_bad(name64, "is 64 bytes, at most 63");
  /* No out-parameter and tiny error buffers are survivable. */
  char err[4];
  assert_int_equal(agoq_ib_hca_filter_parse("mlx5_0", NULL, err, sizeof err), -1);
  agoq_ib_hca_filter f;
  assert_int_equal(agoq_ib_hca_filter_parse("a,,b", &f, err, sizeof err), -1);
  assert_int_equal(strlen(err), 3);
  assert_int_equal(agoq_ib_hca_filter_parse("a,,b", &f, NULL, 0), -1);
}

/* ---- GID choice -------------------------------------------------------------------- */

static agoq_ib_gid_entry gid(const char* text, agoq_ib_gid_type type, int type_errno) {
  agoq_ib_gid_entry g = {.type = type, .type_errno = type_errno};
  assert_int_equal(inet_pton(AF_INET6, text, g.raw), 1);
  return g;
}

static agoq_ib_port_info roce_port(const agoq_ib_gid_entry* gids, int count) {
  agoq_ib_port_info p = {.dev = "mlx5_0", .port = 1, .state = 4, .link_layer = AGOQ_IB_LINK_LAYER_ETHERNET,
                         .active_mtu = 5, .active_width = 2, .active_speed = 64, .gid_count = count, .gids = gids};
  return p;
}

static int choose(const agoq_ib_port_info* p, int index, int family, int version, char* reason, size_t n) {
  agoq_ib_gid_policy pol = {index, family, version};
  int chosen = -7;
  int rc = agoq_ib_gid_choose(p, &pol, &chosen, reason, n);
  if (rc != 0) {
    assert_int_equal(rc, -1);
    assert_int_equal(chosen, -1);
    assert_true(reason[0] != '\0');
    return -1;
  }
  return chosen;
}

#define V1 AGOQ_IB_GID_TYPE_ROCE_V1
#define V2 AGOQ_IB_GID_TYPE_ROCE_V2
#define UNK AGOQ_IB_GID_TYPE_UNKNOWN

/* NVIDIA/nccl#769: link-local v1/v2 at 0/1, IPv4-mapped v1/v2 at 2/3. */
static void test_gid_nccl769(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::a288:c2ff:fe3b:7d62", V1, 0), gid("fe80::a288:c2ff:fe3b:7d62", V2, 0),
                           gid("::ffff:10.10.1.21", V1, 0), gid("::ffff:10.10.1.21", V2, 0)};
  agoq_ib_port_info p = roce_port(t, 4);
  char r[1024];
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), 3);
  assert_contains(r, "GID index 3 ::ffff:10.10.1.21 (RoCE v2, IPv4) on mlx5_0:1");
  assert_contains(r, "lowest-index configured, non-link-local IPv4 RoCE v2");
  assert_contains(r, "[0] fe80::a288:c2ff:fe3b:7d62 link-local");
  assert_contains(r, "[2] ::ffff:10.10.1.21 RoCE v1, not the wanted RoCE v2");
  assert_not_contains(r, "fell back");
  assert_not_contains(r, "assumed");
  /* The defaults are the same policy. */
  int chosen = -1;
  assert_int_equal(agoq_ib_gid_choose(&p, NULL, &chosen, r, sizeof r), 0);
  assert_int_equal(chosen, 3);
  /* RoCE v1 asked for: the v1 twin. */
  assert_int_equal(choose(&p, -1, AF_INET, 1, r, sizeof r), 2);
  assert_contains(r, "(RoCE v1, IPv4)");
  /* Either family: still 3, link-local never qualifies automatically. */
  assert_int_equal(choose(&p, -1, AF_UNSPEC, 2, r, sizeof r), 3);
  /* IPv6 asked for: no global IPv6, falls back to IPv4. */
  assert_int_equal(choose(&p, -1, AF_INET6, 2, r, sizeof r), 3);
  assert_contains(r, "no usable IPv6 GID on this port, fell back to IPv4");
}

/* NVIDIA/nccl#1573: in a container every gid_attrs/types read fails with EINVAL. */
static void test_gid_nccl1573_container(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::1c34:daff:fe5e:1a2b", UNK, EINVAL), gid("fe80::1c34:daff:fe5e:1a2b", UNK, EINVAL),
                           gid("::ffff:172.17.0.2", UNK, EINVAL), gid("::ffff:172.17.0.2", UNK, EINVAL),
                           gid("::", UNK, EINVAL)};
  agoq_ib_port_info p = roce_port(t, 5);
  char r[1024];
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), 2);
  assert_contains(r, "GID index 2 ::ffff:172.17.0.2");
  assert_contains(r, "type unreadable (Invalid argument), assumed RoCE v2");
  assert_int_equal(choose(&p, -1, AF_INET, 1, r, sizeof r), 2);
  assert_contains(r, "assumed RoCE v1");
  /* A readable type of the wanted version beats an unreadable one at a lower index. */
  t[3].type = V2;
  t[3].type_errno = 0;
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), 3);
  assert_not_contains(r, "assumed");
  assert_contains(r, "[2] ::ffff:172.17.0.2 IPv4 unknown (Invalid argument), ranks lower");
  /* ... but the wanted family beats a readable type of the other family. */
  agoq_ib_gid_entry u[] = {gid("2001:db8::7", V2, 0), gid("::ffff:172.17.0.2", UNK, EINVAL)};
  agoq_ib_port_info q = roce_port(u, 2);
  assert_int_equal(choose(&q, -1, AF_INET, 2, r, sizeof r), 1);
  assert_contains(r, "assumed RoCE v2");
  assert_contains(r, "[0] 2001:db8::7 IPv6, not the wanted IPv4");
}

/* uccl-project/uccl#803: only IPv6 global GIDs; the default family (IPv4) finds none. */
static void test_gid_uccl803_ipv6_only(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::5054:ff:fe12:3456", V1, 0), gid("fe80::5054:ff:fe12:3456", V2, 0),
                           gid("2001:db8:1::5", V1, 0), gid("2001:db8:1::5", V2, 0)};
  agoq_ib_port_info p = roce_port(t, 4);
  char r[1024];
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), 3);
  assert_contains(r, "GID index 3 2001:db8:1::5 (RoCE v2, IPv6)");
  assert_contains(r, "no usable IPv4 GID on this port, fell back to IPv6");
  assert_int_equal(choose(&p, -1, AF_INET6, 2, r, sizeof r), 3);
  assert_not_contains(r, "fell back");
}

static void test_gid_unconfigured_table(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("::", V1, 0), gid("::", V2, 0), gid("::", UNK, 0), gid("::", UNK, 0),
                           gid("fe80::", V2, 0), gid("fe80::1", V2, 0), gid("::ffff:10.0.0.1", AGOQ_IB_GID_TYPE_IB, 0)};
  agoq_ib_port_info p = roce_port(t, 7);
  char r[1024];
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "no usable GID on mlx5_0:1");
  assert_contains(r, "[0-3] unconfigured (all zero)");
  assert_contains(r, "[4] fe80:: unconfigured (bare fe80::)");
  assert_contains(r, "[5] fe80::1 link-local");
  assert_contains(r, "[6] ::ffff:10.0.0.1 type IB on an Ethernet port");
  /* An empty table and a missing one. */
  p.gid_count = 0;
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "0 entries");
  p.gid_count = 5;
  p.gids = NULL;
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
  p.gid_count = -3;
  p.gids = t;
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
}

static void test_gid_infiniband(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::248a:703:49:d4f0", AGOQ_IB_GID_TYPE_IB, 0),
                           gid("fe80::248a:703:49:d4f1", AGOQ_IB_GID_TYPE_IB, 0), gid("::", UNK, 0)};
  agoq_ib_port_info p = roce_port(t, 3);
  p.link_layer = AGOQ_IB_LINK_LAYER_INFINIBAND;
  char r[512];
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), 0); /* link-local form is fine on IB */
  assert_contains(r, "GID index 0 fe80::248a:703:49:d4f0 (IB)");
  assert_int_equal(choose(&p, 1, AF_INET, 2, r, sizeof r), 1);
  assert_contains(r, "the index asked for");
  assert_int_equal(choose(&p, 2, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "unconfigured (all zero)");
  assert_int_equal(choose(&p, 3, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "does not exist");
  t[0] = gid("::", UNK, 0);
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "GID index 0 on mlx5_0:1 (InfiniBand) is unconfigured");
}

static void test_gid_explicit(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::a288:c2ff:fe3b:7d62", V1, 0), gid("::", V2, 0), gid("::ffff:10.10.1.21", V1, 0),
                           gid("::ffff:10.10.1.21", V2, 0), gid("::ffff:10.10.1.22", UNK, EINVAL)};
  agoq_ib_port_info p = roce_port(t, 5);
  char r[1024];
  assert_int_equal(choose(&p, 5, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "GID index 5 asked for does not exist on mlx5_0:1 (RoCE, 5 entries, 0..4)");
  assert_int_equal(choose(&p, 1, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "GID index 1 asked for on mlx5_0:1 is unconfigured (all zero)");
  assert_int_equal(choose(&p, 0, AF_INET, 2, r, sizeof r), 0); /* the user asked */
  assert_contains(r, "the index asked for");
  assert_contains(r, "warning: link-local");
  assert_contains(r, "warning: its type is RoCE v1, not the RoCE version asked for (RoCE v2)");
  assert_int_equal(choose(&p, 3, AF_INET, 2, r, sizeof r), 3);
  assert_not_contains(r, "warning");
  assert_int_equal(choose(&p, 2, AF_INET, 2, r, sizeof r), 2);
  assert_contains(r, "warning: its type is RoCE v1");
  assert_not_contains(r, "link-local");
  assert_int_equal(choose(&p, 4, AF_INET, 2, r, sizeof r), 4);
  assert_contains(r, "type unreadable (Invalid argument), assumed RoCE v2");
}

static void test_gid_bad_arguments(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("::ffff:10.0.0.1", V2, 0)};
  agoq_ib_port_info p = roce_port(t, 1);
  char r[256];
  assert_int_equal(choose(&p, -2, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "GID index -2 is invalid");
  assert_int_equal(choose(&p, -1, 12345, 2, r, sizeof r), -1);
  assert_contains(r, "address family 12345 is invalid");
  assert_int_equal(choose(&p, -1, AF_INET, 3, r, sizeof r), -1);
  assert_contains(r, "RoCE version 3 is invalid");
  p.link_layer = AGOQ_IB_LINK_LAYER_UNSPECIFIED;
  assert_int_equal(choose(&p, -1, AF_INET, 2, r, sizeof r), -1);
  assert_contains(r, "neither InfiniBand nor Ethernet");
  int chosen;
  assert_int_equal(agoq_ib_gid_choose(NULL, NULL, &chosen, r, sizeof r), -1);
  assert_int_equal(agoq_ib_gid_choose(&p, NULL, NULL, NULL, 0), -1);
  /* A tiny reason buffer still gets a verdict, NUL-terminated. */
  p.link_layer = AGOQ_IB_LINK_LAYER_ETHERNET;
  char tiny[6];
  assert_int_equal(agoq_ib_gid_choose(&p, NULL, &chosen, tiny, sizeof tiny), 0);
  assert_int_equal(chosen, 0);
  assert_int_equal(strlen(tiny), 5);
  assert_int_equal(agoq_ib_gid_choose(&p, NULL, &chosen, NULL, 0), 0);
}

static void test_gid_predicates_and_format(void** state) {
  (void)state;
  agoq_ib_gid_entry g = gid("::ffff:10.1.2.3", V2, 0);
  assert_true(agoq_ib_gid_is_configured(g.raw));
  assert_true(agoq_ib_gid_is_ipv4_mapped(g.raw));
  assert_false(agoq_ib_gid_is_link_local(g.raw));
  char text[64];
  agoq_ib_gid_format(g.raw, text, sizeof text);
  assert_string_equal(text, "::ffff:10.1.2.3");
  agoq_ib_gid_format(g.raw, text, 5);
  assert_string_equal(text, "::ff");
  agoq_ib_gid_format(NULL, text, sizeof text);
  assert_string_equal(text, "?");
  g = gid("febf::1", V2, 0); /* the top of fe80::/10 */
  assert_true(agoq_ib_gid_is_link_local(g.raw));
  g = gid("fec0::1", V2, 0); /* just above it */
  assert_false(agoq_ib_gid_is_link_local(g.raw));
  g = gid("fe80::", V2, 0);
  assert_false(agoq_ib_gid_is_configured(g.raw));
  g = gid("::", V2, 0);
  assert_false(agoq_ib_gid_is_configured(g.raw));
  g = gid("::fffe:10.1.2.3", V2, 0);
  assert_false(agoq_ib_gid_is_ipv4_mapped(g.raw));
  agoq_ib_gid_policy d = agoq_ib_gid_policy_default();
  assert_int_equal(d.index, -1);
  assert_int_equal(d.family, AF_INET);
  assert_int_equal(d.roce_version, 2);
}

static void test_gid_table_describe(void** state) {
  (void)state;
  agoq_ib_gid_entry t[] = {gid("fe80::a288:c2ff:fe3b:7d62", V1, 0), gid("::ffff:10.10.1.21", V2, 0),
                           gid("2001:db8::1", UNK, EINVAL), gid("fe80::", V2, 0), gid("::", UNK, 0),
                           gid("::", UNK, 0), gid("::", UNK, 0)};
  agoq_ib_port_info p = roce_port(t, 7);
  char out[2048];
  int need = agoq_ib_gid_table_describe(&p, out, sizeof out);
  assert_int_equal(need, (int)strlen(out));
  assert_int_equal(agoq_ib_gid_table_describe(&p, NULL, 0), need);
  assert_contains(out, "mlx5_0:1 GID table (RoCE, 7 entries):\n");
  assert_contains(out, "[0]");
  assert_contains(out, "fe80::a288:c2ff:fe3b:7d62");
  assert_contains(out, "link-local, not routable\n");
  assert_contains(out, "::ffff:10.10.1.21");
  assert_contains(out, "usable (IPv4)\n");
  assert_contains(out, "unknown (Invalid argument) usable (IPv6)\n");
  assert_contains(out, "unconfigured (bare fe80::)\n");
  assert_contains(out, "[4-6]");
  int lines = 0;
  for (const char* c = out; *c != '\0'; c++) lines += *c == '\n';
  assert_int_equal(lines, 1 + 5); /* header, 4 entries, one line for the zero run */
  char small[40];
  assert_int_equal(agoq_ib_gid_table_describe(&p, small, sizeof small), need);
  assert_int_equal(strlen(small), sizeof small - 1);
  p.link_layer = AGOQ_IB_LINK_LAYER_INFINIBAND;
  agoq_ib_gid_table_describe(&p, out, sizeof out);
  assert_contains(out, "(IB, 7 entries)");
  assert_contains(out, "configured\n");
  assert_not_contains(out, "link-local");
  assert_true(agoq_ib_gid_table_describe(NULL, out, sizeof out) > 0);
}

/* ---- sysfs ------------------------------------------------------------------------- */


#define TYPES "class/infiniband/mlx5_0/ports/1/gid_attrs/types"

static int sysfs_setup(void** state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/agoq-ibport-XXXXXX");
  if (mkdtemp(root) == NULL) return -1;
  mkdirs(TYPES);
  put(TYPES "/0", "IB/RoCE v1\n");
  put(TYPES "/1", "RoCE v2\n");
  put(TYPES "/2", "");
  put(TYPES "/3", "RoCE v9\n");
  mkdirs("devices/pci0000:00/0000:00:02.0/0000:17:00.1");
  mkdirs("devices/virtual/soft0");
  mkdirs("class/infiniband/mlx5_1");
  mkdirs("class/infiniband/rxe0");
  char target[PATH_MAX];
  snprintf(target, sizeof target, "%s/class/infiniband/mlx5_0/device", root);
  if (symlink("../../../devices/pci0000:00/0000:00:02.0/0000:17:00.1", target) != 0) return -1;
  snprintf(target, sizeof target, "%s/class/infiniband/rxe0/device", root);
  if (symlink("../../../devices/virtual/soft0", target) != 0) return -1;
  return 0;
}

static int sysfs_teardown(void** state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_sysfs_gid_type(void** state) {
  (void)state;
  agoq_ib_gid_type t = V2;
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 0, &t), 0);
  assert_int_equal(t, AGOQ_IB_GID_TYPE_ROCE_V1);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 1, &t), 0);
  assert_int_equal(t, AGOQ_IB_GID_TYPE_ROCE_V2);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 2, &t), ENODATA);
  assert_int_equal(t, AGOQ_IB_GID_TYPE_UNKNOWN);
  t = V2;
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 3, &t), EPROTO);
  assert_int_equal(t, AGOQ_IB_GID_TYPE_UNKNOWN);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 4, &t), ENOENT);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 2, 0, &t), ENOENT);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_9", 1, 0, &t), ENOENT);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "../mlx5_0", 1, 0, &t), ENODEV);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "..", 1, 0, &t), ENODEV);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "", 1, 0, &t), ENODEV);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 0, 0, &t), ERANGE);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, -1, &t), ERANGE);
  assert_int_equal(agoq_ib_sysfs_gid_type(NULL, "mlx5_0", 1, 0, &t), EFAULT);
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 0, NULL), EFAULT);
  /* A read that fails (a directory here; EINVAL from the kernel in containers) returns
   * the read's own errno, never a type. */
  mkdirs(TYPES "/5");
  t = V2;
  assert_int_equal(agoq_ib_sysfs_gid_type(root, "mlx5_0", 1, 5, &t), EISDIR);
  assert_int_equal(t, AGOQ_IB_GID_TYPE_UNKNOWN);
}

static void test_sysfs_pci_path(void** state) {
  (void)state;
  char real_root[PATH_MAX], want[PATH_MAX + 64], out[PATH_MAX];
  assert_non_null(realpath(root, real_root));
  snprintf(want, sizeof want, "%s/devices/pci0000:00/0000:00:02.0/0000:17:00.0", real_root);
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "mlx5_0", out, sizeof out), 0);
  assert_string_equal(out, want); /* function 1 -> 0: both ports of the NIC share it */
  /* Not a PCI function: left as it is. */
  snprintf(want, sizeof want, "%s/devices/virtual/soft0", real_root);
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "rxe0", out, sizeof out), 0);
  assert_string_equal(out, want);
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "mlx5_1", out, sizeof out), ENOENT); /* no device link */
  assert_string_equal(out, "");
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "mlx5_9", out, sizeof out), ENOENT);
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "a/b", out, sizeof out), ENODEV);
  char tiny[8];
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "mlx5_0", tiny, sizeof tiny), ENAMETOOLONG);
  assert_string_equal(tiny, "");
  assert_int_equal(agoq_ib_sysfs_pci_path(root, "mlx5_0", NULL, 0), EFAULT);
  assert_int_equal(agoq_ib_sysfs_pci_path(NULL, "mlx5_0", out, sizeof out), EFAULT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_speed),
      cmocka_unit_test(test_mtu_and_names),
      cmocka_unit_test(test_port_usable),
      cmocka_unit_test(test_hca_no_filter),
      cmocka_unit_test(test_hca_prefix_pitfall),
      cmocka_unit_test(test_hca_exact),
      cmocka_unit_test(test_hca_exclude),
      cmocka_unit_test(test_hca_exclude_exact_port),
      cmocka_unit_test(test_hca_ports_and_lists),
      cmocka_unit_test(test_hca_malformed),
      cmocka_unit_test(test_gid_nccl769),
      cmocka_unit_test(test_gid_nccl1573_container),
      cmocka_unit_test(test_gid_uccl803_ipv6_only),
      cmocka_unit_test(test_gid_unconfigured_table),
      cmocka_unit_test(test_gid_infiniband),
      cmocka_unit_test(test_gid_explicit),
      cmocka_unit_test(test_gid_bad_arguments),
      cmocka_unit_test(test_gid_predicates_and_format),
      cmocka_unit_test(test_gid_table_describe),
      cmocka_unit_test(test_sysfs_gid_type),
      cmocka_unit_test(test_sysfs_pci_path),
  };
  return cmocka_run_group_tests(tests, sysfs_setup, sysfs_teardown);
}
