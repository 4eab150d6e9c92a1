/* Interface filter syntax (NCCL_SOCKET_IFNAME's) and sysfs reading on a fake tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_netif.h"

static void test_spec_prefix_exclude_exact(void** state) {
  (void)state;
  assert_true(agoq_netif_spec_match(NULL, "eth0"));
  assert_true(agoq_netif_spec_match("", "eth0"));
  assert_true(agoq_netif_spec_match("eth", "eth0"));
  assert_true(agoq_netif_spec_match("ib,eth", "eth1"));
  assert_false(agoq_netif_spec_match("ib,eth", "lo"));
  assert_false(agoq_netif_spec_match("^eth,lo", "eth3"));
  assert_true(agoq_netif_spec_match("^eth,lo", "ens5"));
  assert_true(agoq_netif_spec_match("=eth0", "eth0"));
  assert_false(agoq_netif_spec_match("=eth0", "eth01"));
  assert_false(agoq_netif_spec_match("^=eth0", "eth0"));
  assert_true(agoq_netif_spec_match("^=eth0", "eth01"));
  assert_true(agoq_netif_spec_match("eth0:1234", "eth0")); /* NCCL's ":port" suffix is ignored */
  assert_false(agoq_netif_spec_match(",", "eth0"));
}

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_sysfs_speed_and_pci_path(void** state) {
  (void)state;
  char root[] = "/tmp/agoq-sysfs-XXXXXX";
  assert_non_null(mkdtemp(root));
  char path[PATH_MAX], dev[PATH_MAX];
  snprintf(path, sizeof path, "%s/class", root);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/class/net", root);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/class/net/eth9", root);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/class/net/eth9/speed", root);
  write_file(path, "100000\n");
  snprintf(dev, sizeof dev, "%s/devices", root);
  mkdir(dev, 0700);
  snprintf(dev, sizeof dev, "%s/devices/0000:19:00.0", root);
  mkdir(dev, 0700);
  snprintf(path, sizeof path, "%s/class/net/eth9/device", root);
  assert_int_equal(symlink(dev, path), 0);

  agoq_netif nif = {.name = "eth9"};
  agoq_netif_read_sysfs(root, &nif);
  assert_int_equal(nif.speed_mbps, 100000);
  assert_int_equal(nif.speed_source, AGOQ_NETIF_SPEED_SYSFS); /* measured, and agoq-info says so */
  assert_string_equal(agoq_netif_speed_source_name(nif.speed_source), "sysfs");
  assert_true(nif.has_pci_path);
  char* real = realpath(dev, NULL);
  assert_string_equal(nif.pci_path, real);
  free(real);

  /* A virtual interface: no device link, speed -1 -> NCCL's default, pciPath NULL. */
  snprintf(path, sizeof path, "%s/class/net/veth0", root);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/class/net/veth0/speed", root);
  write_file(path, "-1\n");
  agoq_netif v = {.name = "veth0"};
  agoq_netif_read_sysfs(root, &v);
  assert_int_equal(v.speed_mbps, AGOQ_NETIF_DEFAULT_SPEED_MBPS);
  assert_int_equal(v.speed_source, AGOQ_NETIF_SPEED_DEFAULT); /* a guess, not a measurement */
  assert_string_equal(agoq_netif_speed_source_name(v.speed_source), "default");
  assert_false(v.has_pci_path);

  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
}

static void test_discover_loopback(void** state) {
  (void)state;
  agoq_netif ifs[AGOQ_NETIF_MAX];
  int n = agoq_netif_discover("=lo", AGOQ_NETIF_FAMILY_IPV4, "/sys", ifs, AGOQ_NETIF_MAX);
  assert_int_equal(n, 1);
  assert_string_equal(ifs[0].name, "lo");
  assert_int_equal(ifs[0].addr.ss_family, AF_INET);
  assert_false(ifs[0].has_pci_path);
  assert_true(ifs[0].running); /* lo is up and always has carrier */
  assert_int_equal(agoq_netif_discover("=no-such-if", AGOQ_NETIF_FAMILY_ANY, "/sys", ifs, AGOQ_NETIF_MAX), 0);
  /* The default never picks lo while another interface is up, and never docker*. */
  n = agoq_netif_discover("", AGOQ_NETIF_FAMILY_ANY, "/sys", ifs, AGOQ_NETIF_MAX);
  assert_true(n >= 1);
  for (int i = 0; i < n && n > 1; i++) assert_string_not_equal(ifs[i].name, "lo");
  for (int i = 0; i < n; i++) assert_true(strncmp(ifs[i].name, "docker", 6) != 0);
}

/* What the init error lists when a filter matches nothing: every interface, its address
 * and state (the loopback test above already needs lo up with 127.0.0.1). */
static void test_list_all_interfaces(void** state) {
  (void)state;
  char buf[2048];
  int n = agoq_netif_list_all(buf, sizeof buf);
  assert_true(n >= 1);
  assert_non_null(strstr(buf, "lo 127.0.0.1 up"));
  /* A short buffer is truncated, never overrun. */
  char small[8];
  memset(small, 'x', sizeof small);
  assert_int_equal(agoq_netif_list_all(small, 4), n);
  assert_true(strlen(small) < 4);
  assert_int_equal(small[5], 'x');
  assert_string_equal(agoq_netif_state_name(IFF_UP | IFF_RUNNING), "up");
  assert_string_equal(agoq_netif_state_name(IFF_UP), "no carrier");
  assert_string_equal(agoq_netif_state_name(0), "down");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_prefix_exclude_exact),
      cmocka_unit_test(test_sysfs_speed_and_pci_path),
      cmocka_unit_test(test_discover_loopback),
      cmocka_unit_test(test_list_all_interfaces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
