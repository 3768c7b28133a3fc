/* opath_holder PATH --ready FILE [--exit-after S]: keep an O_PATH fd of PATH, which names
 * the file without opening it (no open() of the device ever runs): not a GPU holder.
 * SIGTERM ends it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "attack.h"

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 3600, NULL);
    const char *path = a.hold;
    if (!path) die("a PATH is required", EINVAL);
    if (open(path, O_PATH) < 0) die(path, errno);
    write_ready(a.ready);
    alarm((unsigned)a.exit_after);
    for (;;) pause();
}
