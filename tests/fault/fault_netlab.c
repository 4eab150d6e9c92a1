/* linkdown (netlab: a veth set down mid-transfer) is not implemented yet: see
 * docs/reliability.md. It skips (77) so that a caller can tell it did not run. */
#include <stdio.h>

#include "fault.h"

int fault_sc_linkdown(void) {
  printf("fault: linkdown: not implemented yet (skipped)\n");
  return 77;
}
