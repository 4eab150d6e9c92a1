/*
 * agoq_cuda_device_count / agoq_cuda_pci_bus_id. Without a usable GPU only the failure
 * paths can be checked; the test then exits 77, which CTest reports as skipped.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "agoq_cuda_probe.h"

#define SKIPPED 77

static int failures;

#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                       \
    }                                                                   \
  } while (0)

/* "dddd:bb:dd.f", lowercase hex: the name of the device under /sys/bus/pci/devices. */
static int is_pci_bus_id(const char* s) {
  static const char pattern[] = "xxxx:xx:xx.x";
  if (strlen(s) != sizeof(pattern) - 1) return 0;
  for (size_t i = 0; pattern[i] != '\0'; i++) {
    if (pattern[i] == 'x') {
      if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i])) return 0;
    } else if (s[i] != pattern[i]) {
      return 0;
    }
  }
  return 1;
}

static void check_pattern_matcher(void) {
  EXPECT(is_pci_bus_id("0000:3b:00.0"));
  EXPECT(!is_pci_bus_id("0000:3B:00.0"));
  EXPECT(!is_pci_bus_id("00000000:3b:00.0"));
  EXPECT(!is_pci_bus_id("0000:3b:00"));
}

/* Invalid requests fail, leave an empty string, and do not disturb later calls. */
static void check_failure_paths(int count) {
  char buf[64];
  memset(buf, 'z', sizeof(buf));
  EXPECT(agoq_cuda_pci_bus_id(count, buf, (int)sizeof(buf)) == -1);
  EXPECT(buf[0] == '\0');
  EXPECT(agoq_cuda_pci_bus_id(-1, buf, (int)sizeof(buf)) == -1);
  EXPECT(agoq_cuda_pci_bus_id(0, NULL, 64) == -1);
  EXPECT(agoq_cuda_pci_bus_id(0, buf, 0) == -1);
  memset(buf, 'z', sizeof(buf));
  EXPECT(agoq_cuda_pci_bus_id(0, buf, 12) == -1);
  EXPECT(buf[0] == '\0');
  EXPECT(agoq_cuda_device_count() == count);
}

int main(void) {
  check_pattern_matcher();

  int count = agoq_cuda_device_count();
  EXPECT(count >= 0);
  EXPECT(agoq_cuda_device_count() == count);
  check_failure_paths(count);

  for (int dev = 0; dev < count; dev++) {
    char id[13];
    int rc = agoq_cuda_pci_bus_id(dev, id, (int)sizeof(id));
    EXPECT(rc == 0);
    if (rc == 0) {
      printf("cuda device %d: pci %s\n", dev, id);
      EXPECT(is_pci_bus_id(id));
    }
  }

  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  if (count == 0) {
    printf("no usable CUDA device (no GPU or no driver): failure paths checked, rest skipped\n");
    return SKIPPED;
  }
  return 0;
}
