/* cgpad DIR N [DIR N]...: make N empty child cgroups e0..e<N-1> in each cgroup DIR, at
 * mkdir(2)'s pace (a tenant's cgroup tree built in a moment: issue 39's "10 units with
 * 10,000 empty child cgroups each"). Existing ones are kept; any other error ends it (2). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        int dir = open(argv[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) {
            fprintf(stderr, "cgpad: %s: %s\n", argv[i], strerror(errno));
            return 2;
        }
        long n = atol(argv[i + 1]);
        char name[32];
        for (long k = 0; k < n; k++) {
            snprintf(name, sizeof name, "e%ld", k);
            if (mkdirat(dir, name, 0755) < 0 && errno != EEXIST) {
                fprintf(stderr, "cgpad: %s/%s: %s\n", argv[i], name, strerror(errno));
                return 2;
            }
        }
        close(dir);
    }
    return 0;
}
