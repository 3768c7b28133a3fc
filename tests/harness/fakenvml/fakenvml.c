/*
 * fakenvml.c - a fake libnvidia-ml.so.1 for pveclean's tests.
 *
 * Exports a subset of NVML's real C ABI (same symbol names, struct layouts
 * and return codes as nvml.h / nvidia-ml-py) so that the unmodified pynvml
 * module can load it in place of the NVIDIA driver's library.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -o DIR/libnvidia-ml.so.1 fakenvml.c
 *
 * The "hardware" is described by a text state file that is re-read on every
 * API call: $FAKE_NVML_STATE if set and non-empty, else "fakenvml.state"
 * in the directory of the loaded .so (found with dladdr, so it works with a
 * cleared environment).  A missing file means zero GPUs.  Grammar (one
 * directive per line, '#' starts a comment, fields separated by blanks;
 * malformed lines are ignored):
 *
 *   gpu <index> <uuid> <name> <total_mib> <reserved_mib> [<minor>]
 *   proc <gpu_index> <host_pid> <used_mib|na|na:<mib>> [compute|graphics [<gi> <ci>]]
 *   leak <gpu_index> <mib>
 *   init_error <NAME|code>
 *   hang <seconds>
 *   stuck <path>
 *   proc_query_error <NAME|code>
 *   gpu_error <gpu_index> handle|memory|info|minor|procs|pci <NAME|code>
 *   pci_domain <gpu_index> <hex domain>
 *   missing v3|v2
 *   persistence <gpu_index> on|off
 *   driver_version <version>
 *   reset <gpu_index>
 *   mig <gpu_index> <mig_devices>
 *
 * reset (appended by the lab's nvidia-smi stand-in when it resets a GPU) frees the leaks of
 * that GPU on the lines before it, as a GPU reset frees memory no process holds.
 * mig turns MIG mode on for a GPU with that many MIG devices (0: MIG on, no instances):
 * nvmlDeviceGetMigMode, nvmlDeviceGetMaxMigDeviceCount (7) and
 * nvmlDeviceGetMigDeviceHandleByIndex (NOT_FOUND past them) answer for it.
 *
 *   release <gpu_index> <seconds|inf> [<steps>]
 *   died <pid> <epoch seconds>
 *
 * release: a real driver gives a dead process's memory back some time after the process is
 * gone (seconds when it pinned host memory), and NVML shows it under no process meanwhile.
 * With it, a proc line's memory on that GPU stays allocated, listed under no process, for
 * <seconds> after the library first sees its PID dead ("inf": it never comes back), falling
 * in <steps> equal steps (default 1: all at the end). The first call that sees the PID dead
 * appends "died <pid> <time>" to the state file (CLOCK_REALTIME), so every later call, in
 * any process, counts from then; a test may write the line itself.
 *
 * A proc line with <gi> <ci> is one row of a MIG instance: one PID may have several
 * rows on one GPU (one per GPU/compute instance), each listed and counted on its own.
 * gpu_error makes one getter of one GPU fail ("handle": nvmlDeviceGetHandleBy*; "info":
 * name and UUID; "procs": every running-process call), as a GPU that fell off the bus
 * (GPU_IS_LOST, Xid 79) or answers with an error does; the other GPUs answer.
 * stuck makes every call stat() <path> first: on a FUSE mount whose server reads requests
 * and never answers (tests/harness/hangfs.py), the caller sleeps uninterruptibly in the
 * kernel and even SIGKILL does not end it until the server goes, as a process stuck in the
 * GPU driver does ("hang" only sleeps, which SIGKILL ends).
 * persistence sets a GPU's persistence mode (off when no line says; the last line wins).
 * nvmlDeviceSetPersistenceMode appends such a line to the state file, as the driver keeps the
 * mode until the next change or reboot; it needs root (NO_PERMISSION otherwise, as NVML
 * says), and `gpu_error <i> persistence <CODE>` makes both getter and setter fail. What the
 * persistence daemon does when the mode changes (it closes the GPU's node) is the lab's
 * persistenced stand-in's part, not this library's.
 * driver_version sets what nvmlSystemGetDriverVersion reports (550.127.05 when no line says),
 * as a host whose loaded module and userspace differ after a driver upgrade.
 * pci_domain gives a GPU a PCI domain (Intel VMD: 0x10000 and above).
 * "missing v3" makes the _v3 process calls answer FUNCTION_NOT_FOUND, as pynvml sees a
 * driver before R510 (no such symbol); "missing v2" the _v2 ones too.  A build with
 * -DFAKE_NVML_NO_V3 (and -DFAKE_NVML_NO_V2) leaves those symbols out altogether.
 *
 * A proc counts only while /proc/<pid>/stat exists and its state is not Z/X (a Z
 * leader counts while another thread of the process runs, as the driver sees it).
 * "na" reports usedGpuMemory = NVML_VALUE_NOT_AVAILABLE and counts 0 MiB in
 * the device's used memory; "na:<mib>" reports N/A but counts <mib>.
 *
 * Memory (bytes = MiB * 1048576), following real NVML semantics:
 *   allocated = sum(live procs on the GPU) + leaks
 *   v1: used = reserved + allocated,               free = total - used
 *   v2: reserved = reserved, used = allocated,     free = total - reserved - used
 *
 * The only global state is the nvmlInit reference count.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu
#define MIB 1048576ULL

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct { /* layout of the unversioned (v1) process calls */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* _v2 and _v3 process calls (nvmlProcessInfo_t) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* ---- error codes ------------------------------------------------------ */

static const struct {
    int code;
    const char *name;
    const char *text;
} ERRORS[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt Request Issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {22, "VGPU_ECC_NOT_SUPPORTED", "ECC is not supported on vGPU"},
    {23, "INSUFFICIENT_RESOURCES", "Insufficient resources"},
    {24, "FREQ_NOT_SUPPORTED", "Frequency not supported"},
    {25, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {26, "DEPRECATED", "Deprecated"},
    {27, "NOT_READY", "Not ready"},
    {28, "GPU_NOT_FOUND", "GPU not found"},
    {29, "INVALID_STATE", "Invalid state"},
    {30, "RESET_TYPE_NOT_SUPPORTED", "Reset type not supported"},
    {999, "UNKNOWN", "Unknown Error"},
};

/* ---- state ------------------------------------------------------------ */

#define MAX_GPUS 64
#define MAX_PROCS 1024
#define KIND_COMPUTE 0
#define KIND_GRAPHICS 1

struct gpu {
    unsigned int index, minor;
    unsigned long long total_mib, reserved_mib, leak_mib;
    char uuid[96];
    char name[96];
};

struct proc {
    unsigned int gpu, pid, kind, na, listed, gi, ci;
    unsigned long long mib;
};

enum { F_HANDLE, F_MEMORY, F_INFO, F_MINOR, F_PROCS, F_PCI, F_PERSIST, NFAULTS };
static const char *const FAULT_NAMES[NFAULTS] = {"handle", "memory", "info",  "minor",
                                                 "procs",  "pci",    "persistence"};

/* release and died lines: how long a dead process's memory stays allocated, per GPU */
struct release_state {
    double seconds[MAX_GPUS]; /* < 0: no release line (memory goes with the process) */
    unsigned int steps[MAX_GPUS];
    int any, ndied;
    unsigned int died_pid[MAX_PROCS];
    double died_at[MAX_PROCS];
};

struct state {
    int ngpus, nprocs;
    int init_error, proc_error;
    int missing_v3, missing_v2;
    double hang;
    char stuck[256];
    struct gpu gpus[MAX_GPUS];
    struct proc procs[MAX_PROCS];
    int fault[MAX_GPUS][NFAULTS]; /* per GPU index, per getter: an NVML error or 0 */
    unsigned int domain[MAX_GPUS];
    unsigned char persistence[MAX_GPUS]; /* 1: persistence mode enabled */
    char driver_version[64];             /* "": the default */
    int mig[MAX_GPUS];                   /* MIG devices + 1 (0: MIG off) */
    struct release_state rel; /* release and died lines */
};

/* One static byte per possible GPU: handles are real pointers into it. */
static const char HANDLE_BASE[MAX_GPUS];
static int g_refcount; /* the only mutable global */

static int parse_ull(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return 0;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return errno == 0 && *end == '\0';
}

static int parse_uint(const char *s, unsigned int *out)
{
    unsigned long long v;
    if (!parse_ull(s, &v) || v > 0xFFFFFFFFULL)
        return 0;
    *out = (unsigned int)v;
    return 1;
}

static int parse_error(const char *s, int *out)
{
    unsigned int v;
    size_t i;
    if (!s)
        return 0;
    if (parse_uint(s, &v)) {
        *out = (int)v;
        return 1;
    }
    if (strncmp(s, "NVML_ERROR_", 11) == 0)
        s += 11;
    for (i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++) {
        if (strcmp(s, ERRORS[i].name) == 0) {
            *out = ERRORS[i].code;
            return 1;
        }
    }
    return 0;
}

static struct gpu *find_gpu(struct state *st, unsigned int index)
{
    int i;
    for (i = 0; i < st->ngpus; i++)
        if (st->gpus[i].index == index)
            return &st->gpus[i];
    return NULL;
}

/* The error a getter of GPU `index` is made to answer (0: none). */
static nvmlReturn_t fault(const struct state *st, unsigned int index, int which)
{
    return index < MAX_GPUS ? st->fault[index][which] : NVML_SUCCESS;
}

static int release_line(struct state *st, char **tok, int n);

static void parse_line(struct state *st, char *line)
{
    char *tok[8], *save = NULL, *p;
    int n = 0;

    if ((p = strchr(line, '#')) != NULL)
        *p = '\0';
    for (p = strtok_r(line, " \t\r\n", &save); p; p = strtok_r(NULL, " \t\r\n", &save)) {
        if (n == 8)
            return; /* too many fields: malformed */
        tok[n++] = p;
    }
    if (n == 0 || release_line(st, tok, n))
        return;

    if (strcmp(tok[0], "gpu") == 0 && (n == 6 || n == 7)) {
        struct gpu g;
        memset(&g, 0, sizeof(g));
        if (st->ngpus >= MAX_GPUS || !parse_uint(tok[1], &g.index) || g.index >= MAX_GPUS ||
            !parse_ull(tok[4], &g.total_mib) || !parse_ull(tok[5], &g.reserved_mib) ||
            g.reserved_mib > g.total_mib || strlen(tok[2]) >= sizeof(g.uuid) ||
            strlen(tok[3]) >= sizeof(g.name) || find_gpu(st, g.index))
            return;
        g.minor = g.index;
        if (n == 7 && !parse_uint(tok[6], &g.minor))
            return;
        strcpy(g.uuid, tok[2]);
        strcpy(g.name, tok[3]);
        st->gpus[st->ngpus++] = g;
    } else if (strcmp(tok[0], "proc") == 0 && (n == 4 || n == 5 || n == 7)) {
        struct proc pr;
        memset(&pr, 0, sizeof(pr));
        pr.gi = pr.ci = NO_INSTANCE;
        if (n == 7 && (!parse_uint(tok[5], &pr.gi) || !parse_uint(tok[6], &pr.ci)))
            return;
        if (st->nprocs >= MAX_PROCS || !parse_uint(tok[1], &pr.gpu) ||
            !parse_uint(tok[2], &pr.pid) || pr.pid == 0)
            return;
        if (strcmp(tok[3], "na") == 0)
            pr.na = 1;
        else if (strncmp(tok[3], "na:", 3) == 0 && parse_ull(tok[3] + 3, &pr.mib))
            pr.na = 1;
        else if (!parse_ull(tok[3], &pr.mib))
            return;
        if (n >= 5) {
            if (strcmp(tok[4], "graphics") == 0)
                pr.kind = KIND_GRAPHICS;
            else if (strcmp(tok[4], "compute") != 0)
                return;
        }
        st->procs[st->nprocs++] = pr;
    } else if (strcmp(tok[0], "leak") == 0 && n == 3) {
        unsigned int gi;
        unsigned long long mib;
        if (parse_uint(tok[1], &gi) && parse_ull(tok[2], &mib)) {
            /* leaks may precede their gpu line: apply them in a second pass */
            if (st->nprocs < MAX_PROCS) {
                struct proc *pr = &st->procs[st->nprocs++];
                memset(pr, 0, sizeof(*pr));
                pr->gpu = gi;
                pr->pid = 0; /* pid 0 marks a leak */
                pr->mib = mib;
            }
        }
    } else if (strcmp(tok[0], "init_error") == 0 && n == 2) {
        parse_error(tok[1], &st->init_error);
    } else if (strcmp(tok[0], "proc_query_error") == 0 && n == 2) {
        parse_error(tok[1], &st->proc_error);
    } else if (strcmp(tok[0], "gpu_error") == 0 && n == 4) {
        unsigned int gi;
        int f, code;
        if (!parse_uint(tok[1], &gi) || gi >= MAX_GPUS || !parse_error(tok[3], &code))
            return;
        for (f = 0; f < NFAULTS; f++)
            if (strcmp(tok[2], FAULT_NAMES[f]) == 0)
                st->fault[gi][f] = code;
    } else if (strcmp(tok[0], "pci_domain") == 0 && n == 3) {
        unsigned int gi;
        char *end;
        unsigned long v = strtoul(tok[2], &end, 16);
        if (parse_uint(tok[1], &gi) && gi < MAX_GPUS && *end == '\0' && v <= 0xFFFFFFFFul)
            st->domain[gi] = (unsigned int)v;
    } else if (strcmp(tok[0], "missing") == 0 && n == 2) {
        if (strcmp(tok[1], "v3") == 0)
            st->missing_v3 = 1;
        else if (strcmp(tok[1], "v2") == 0)
            st->missing_v2 = st->missing_v3 = 1;
    } else if (strcmp(tok[0], "persistence") == 0 && n == 3) {
        unsigned int gi;
        if (parse_uint(tok[1], &gi) && gi < MAX_GPUS) {
            if (strcmp(tok[2], "on") == 0)
                st->persistence[gi] = 1;
            else if (strcmp(tok[2], "off") == 0)
                st->persistence[gi] = 0;
        }
    } else if (strcmp(tok[0], "driver_version") == 0 && n == 2) {
        if (strlen(tok[1]) < sizeof(st->driver_version))
            strcpy(st->driver_version, tok[1]);
    } else if (strcmp(tok[0], "reset") == 0 && n == 2) {
        unsigned int gi;
        int i;
        if (parse_uint(tok[1], &gi) && gi < MAX_GPUS)
            for (i = 0; i < st->nprocs; i++)
                if (st->procs[i].pid == 0 && st->procs[i].gpu == gi)
                    st->procs[i].mib = 0; /* a leak before the reset: freed */
    } else if (strcmp(tok[0], "mig") == 0 && n == 3) {
        unsigned int gi, devs;
        if (parse_uint(tok[1], &gi) && gi < MAX_GPUS && parse_uint(tok[2], &devs) && devs <= 7)
            st->mig[gi] = (int)devs + 1;
    } else if (strcmp(tok[0], "stuck") == 0 && n == 2) {
        snprintf(st->stuck, sizeof(st->stuck), "%s", tok[1]);
    } else if (strcmp(tok[0], "hang") == 0 && n == 2) {
        char *end;
        double v = strtod(tok[1], &end);
        if (*end == '\0' && v >= 0 && v < 1e6)
            st->hang = v;
    }
}

static void state_path(char *buf, size_t len)
{
    const char *env = getenv("FAKE_NVML_STATE");
    Dl_info info;
    const char *slash;

    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return;
    }
    memset(&info, 0, sizeof(info));
    if (dladdr((void *)&state_path, &info) && info.dli_fname &&
        (slash = strrchr(info.dli_fname, '/')) != NULL)
        snprintf(buf, len, "%.*s/fakenvml.state", (int)(slash - info.dli_fname),
                 info.dli_fname);
    else
        snprintf(buf, len, "fakenvml.state");
}

/* Reads the state file; returns NULL only when out of memory. */
static struct state *load_state(void)
{
    char path[4096], line[1024];
    struct state *st = calloc(1, sizeof(*st));
    FILE *f;
    int i;

    if (!st)
        return NULL;
    state_path(path, sizeof(path));
    f = fopen(path, "re");
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            size_t l = strlen(line);
            if (l == sizeof(line) - 1 && line[l - 1] != '\n') {
                int c; /* overlong line: skip it entirely */
                while ((c = fgetc(f)) != EOF && c != '\n')
                    ;
                continue;
            }
            parse_line(st, line);
        }
        fclose(f);
    }
    /* move leak entries (pid 0) into their GPUs */
    for (i = 0; i < st->nprocs;) {
        if (st->procs[i].pid == 0) {
            struct gpu *g = find_gpu(st, st->procs[i].gpu);
            if (g)
                g->leak_mib += st->procs[i].mib;
            st->procs[i] = st->procs[--st->nprocs];
        } else {
            i++;
        }
    }
    return st;
}

/* A thread other than the (zombie) leader that has not exited. */
static int live_thread(unsigned int pid)
{
    char path[96], buf[512], *rp;
    size_t n;
    FILE *f;
    DIR *d;
    struct dirent *e;
    int alive = 0;

    snprintf(path, sizeof(path), "/proc/%u/task", pid);
    d = opendir(path);
    if (!d)
        return 0;
    while (!alive && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || (unsigned)atoi(e->d_name) == pid)
            continue;
        snprintf(path, sizeof(path), "/proc/%u/task/%.20s/stat", pid, e->d_name);
        f = fopen(path, "re");
        if (!f)
            continue;
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        rp = strrchr(buf, ')');
        alive = rp && rp[1] == ' ' && rp[2] != '\0' && rp[2] != 'Z' && rp[2] != 'X';
    }
    closedir(d);
    return alive;
}

static int pid_alive(unsigned int pid)
{
    char path[64], buf[512], *rp;
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    f = fopen(path, "re");
    if (!f)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ' || rp[2] == '\0')
        return 0;
    if (rp[2] == 'Z')
        return live_thread(pid); /* the driver counts a process while a thread of it runs */
    return rp[2] != 'X';
}

static void do_hang(const struct state *st)
{
    struct timespec ts;
    struct stat sb;
    double seconds = st->hang;
    if (st->stuck[0])
        (void)stat(st->stuck, &sb);
    if (seconds <= 0)
        return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static int initialized(void)
{
    return __atomic_load_n(&g_refcount, __ATOMIC_SEQ_CST) > 0;
}

/* Common prologue: load state, hang, check init. *out is freed by caller. */
static nvmlReturn_t enter(struct state **out)
{
    struct state *st = load_state();
    *out = NULL;
    if (!st)
        return NVML_ERROR_MEMORY;
    do_hang(st);
    if (!initialized()) {
        free(st);
        return NVML_ERROR_UNINITIALIZED;
    }
    *out = st;
    return NVML_SUCCESS;
}

/* Like enter(), and resolves a device handle to its GPU. */
static nvmlReturn_t enter_dev(nvmlDevice_t dev, struct state **out, struct gpu **g)
{
    nvmlReturn_t r = enter(out);
    uintptr_t off = (uintptr_t)dev - (uintptr_t)HANDLE_BASE;
    if (r != NVML_SUCCESS)
        return r;
    if (!dev || (uintptr_t)dev < (uintptr_t)HANDLE_BASE || off >= MAX_GPUS) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else if ((*g = find_gpu(*out, (unsigned int)off)) == NULL) {
        r = NVML_ERROR_GPU_IS_LOST; /* GPU vanished from the state file */
    }
    if (r != NVML_SUCCESS) {
        free(*out);
        *out = NULL;
    }
    return r;
}

static nvmlReturn_t copy_str(char *buf, unsigned int len, const char *s)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---- release: a dead process's memory given back late ------------------ */

static int release_line(struct state *st, char **tok, int n)
{
    struct release_state *r = &st->rel;
    unsigned int gi, steps = 1, pid;
    char *end;
    double v;

    if (!r->any) { /* first line of a load: no GPU has a release yet */
        for (gi = 0; gi < MAX_GPUS; gi++)
            r->seconds[gi] = -1;
        r->any = 1;
    }
    if (strcmp(tok[0], "release") == 0 && (n == 3 || n == 4)) {
        v = strcmp(tok[2], "inf") == 0 ? 1e300 : strtod(tok[2], &end);
        if (parse_uint(tok[1], &gi) && gi < MAX_GPUS && (strcmp(tok[2], "inf") == 0 || *end == '\0') &&
            v >= 0 && (n == 3 || (parse_uint(tok[3], &steps) && steps > 0))) {
            r->seconds[gi] = v;
            r->steps[gi] = steps;
        }
        return 1;
    }
    if (strcmp(tok[0], "died") == 0 && n == 3) {
        v = strtod(tok[2], &end);
        if (parse_uint(tok[1], &pid) && *end == '\0' && r->ndied < MAX_PROCS) {
            r->died_pid[r->ndied] = pid;
            r->died_at[r->ndied++] = v;
        }
        return 1;
    }
    return 0;
}

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* When `pid` was first seen dead; a first sight is appended to the state file. */
static double died_at(const struct state *st, unsigned int pid)
{
    char path[4096];
    double now;
    FILE *f;
    int i;

    for (i = 0; i < st->rel.ndied; i++)
        if (st->rel.died_pid[i] == pid)
            return st->rel.died_at[i];
    now = now_real();
    state_path(path, sizeof(path));
    f = fopen(path, "ae");
    if (f) {
        fprintf(f, "died %u %.6f\n", pid, now);
        fclose(f);
    }
    return now;
}

/* MiB of this GPU's dead processes the driver has not given back yet. */
static unsigned long long releasing_mib(const struct state *st, const struct gpu *g)
{
    double secs = g->index < MAX_GPUS && st->rel.any ? st->rel.seconds[g->index] : -1;
    unsigned long long sum = 0;
    unsigned int steps;
    double gone;
    int i;

    if (secs < 0)
        return 0;
    steps = st->rel.steps[g->index];
    for (i = 0; i < st->nprocs; i++) {
        const struct proc *p = &st->procs[i];
        if (p->gpu != g->index || pid_alive(p->pid))
            continue;
        gone = now_real() - died_at(st, p->pid);
        if (gone < secs) /* steps done so far, each 1/steps of it given back */
            sum += p->mib * (steps - (unsigned int)(gone / secs * steps)) / steps;
    }
    return sum;
}

static unsigned long long allocated_mib(const struct state *st, const struct gpu *g)
{
    unsigned long long sum = g->leak_mib;
    int i;
    for (i = 0; i < st->nprocs; i++)
        if (st->procs[i].gpu == g->index && pid_alive(st->procs[i].pid))
            sum += st->procs[i].mib;
    return sum + releasing_mib(st, g);
}

/* ---- init / system ---------------------------------------------------- */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    struct state *st = load_state();
    nvmlReturn_t r;
    (void)flags;
    if (!st)
        return NVML_ERROR_MEMORY;
    do_hang(st);
    r = st->init_error;
    free(st);
    if (r == NVML_SUCCESS)
        __atomic_add_fetch(&g_refcount, 1, __ATOMIC_SEQ_CST);
    return r;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    struct state *st = load_state();
    int cur;
    if (st) {
        do_hang(st);
        free(st);
    }
    cur = __atomic_load_n(&g_refcount, __ATOMIC_SEQ_CST);
    while (cur > 0) {
        if (__atomic_compare_exchange_n(&g_refcount, &cur, cur - 1, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return NVML_SUCCESS;
    }
    return NVML_ERROR_UNINITIALIZED;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    size_t i;
    for (i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (ERRORS[i].code == result)
            return ERRORS[i].text;
    return "Unknown Error";
}

static nvmlReturn_t system_string(char *buf, unsigned int len, const char *s)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    if (r == NVML_SUCCESS)
        r = copy_str(buf, len, s);
    free(st);
    return r;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    if (r == NVML_SUCCESS)
        r = copy_str(version, length, st->driver_version[0] ? st->driver_version : "550.127.05");
    free(st);
    return r;
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_string(version, length, "12.550.127.05");
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    if (r == NVML_SUCCESS) {
        if (!cudaDriverVersion)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *cudaDriverVersion = 12040;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices ---------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    if (r == NVML_SUCCESS) {
        if (!deviceCount)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *deviceCount = (unsigned int)st->ngpus;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    if (r == NVML_SUCCESS) {
        if (!device || !find_gpu(st, index))
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if ((r = fault(st, index, F_HANDLE)) == NVML_SUCCESS)
            *device = (nvmlDevice_t)(HANDLE_BASE + index);
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct state *st;
    nvmlReturn_t r = enter(&st);
    int i;
    if (r == NVML_SUCCESS) {
        if (!uuid || !device) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            r = NVML_ERROR_NOT_FOUND;
            for (i = 0; i < st->ngpus; i++) {
                if (strcmp(st->gpus[i].uuid, uuid) == 0) {
                    r = fault(st, st->gpus[i].index, F_HANDLE);
                    if (r == NVML_SUCCESS)
                        *device = (nvmlDevice_t)(HANDLE_BASE + st->gpus[i].index);
                    break;
                }
            }
        }
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!index)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *index = g->index;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!minorNumber)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if ((r = fault(st, g->index, F_MINOR)) == NVML_SUCCESS)
            *minorNumber = g->minor;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS && (r = fault(st, g->index, F_INFO)) == NVML_SUCCESS)
        r = copy_str(name, length, g->name);
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS && (r = fault(st, g->index, F_INFO)) == NVML_SUCCESS)
        r = copy_str(uuid, length, g->uuid);
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!pci) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if ((r = fault(st, g->index, F_PCI)) == NVML_SUCCESS) {
            memset(pci, 0, sizeof(*pci));
            pci->domain = st->domain[g->index];
            pci->bus = 0x18 + g->index;
            pci->device = 0;
            pci->pciDeviceId = 0x233010DE;
            pci->pciSubSystemId = 0x16C110DE;
            /* as the driver writes them: the legacy id keeps 4 domain digits, busId 8 */
            snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:00.0",
                     pci->domain & 0xFFFF, pci->bus);
            snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:00.0", pci->domain, pci->bus);
        }
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!memory) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if ((r = fault(st, g->index, F_MEMORY)) != NVML_SUCCESS) {
            /* the getter's own error */
        } else {
            unsigned long long used = g->reserved_mib + allocated_mib(st, g);
            if (used > g->total_mib)
                used = g->total_mib;
            memory->total = g->total_mib * MIB;
            memory->used = used * MIB;
            memory->free = (g->total_mib - used) * MIB;
        }
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!memory) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (memory->version != nvmlMemory_v2) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if ((r = fault(st, g->index, F_MEMORY)) != NVML_SUCCESS) {
            /* the getter's own error */
        } else {
            unsigned long long used = allocated_mib(st, g);
            if (used > g->total_mib - g->reserved_mib)
                used = g->total_mib - g->reserved_mib;
            memory->total = g->total_mib * MIB;
            memory->reserved = g->reserved_mib * MIB;
            memory->used = used * MIB;
            memory->free = (g->total_mib - g->reserved_mib - used) * MIB;
        }
    }
    free(st);
    return r;
}

/* ---- process lists ---------------------------------------------------- */

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                      unsigned int kind, int version)
{
    struct state *st;
    struct gpu *g;
    unsigned int needed = 0, k = 0;
    int i;
    nvmlReturn_t r = enter_dev(device, &st, &g);

    if (r != NVML_SUCCESS)
        return r;
    if (!infoCount) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else if ((version == 3 && st->missing_v3) || (version == 2 && st->missing_v2)) {
        r = NVML_ERROR_FUNCTION_NOT_FOUND;
    } else if (st->proc_error) {
        r = st->proc_error;
    } else if ((r = fault(st, g->index, F_PROCS)) != NVML_SUCCESS) {
        /* this GPU's process list fails */
    } else {
        for (i = 0; i < st->nprocs; i++) {
            struct proc *p = &st->procs[i];
            p->listed = p->gpu == g->index && p->kind == kind && pid_alive(p->pid);
            needed += p->listed;
        }
        if (*infoCount < needed) {
            *infoCount = needed;
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        } else if (needed > 0 && !infos) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            for (i = 0; i < st->nprocs; i++) {
                struct proc *p = &st->procs[i];
                unsigned long long mem = p->na ? NVML_VALUE_NOT_AVAILABLE_ULL : p->mib * MIB;
                if (!p->listed)
                    continue;
                if (version == 1) {
                    nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)infos + k;
                    e->pid = p->pid;
                    e->usedGpuMemory = mem;
                } else {
                    nvmlProcessInfo_v2_t *e = (nvmlProcessInfo_v2_t *)infos + k;
                    e->pid = p->pid;
                    e->usedGpuMemory = mem;
                    e->gpuInstanceId = p->gi;
                    e->computeInstanceId = p->ci;
                }
                k++;
            }
            *infoCount = needed;
        }
    }
    free(st);
    return r;
}

#define PROC_FN(fname, kind, version)                                                     \
    API nvmlReturn_t fname(nvmlDevice_t device, unsigned int *infoCount, void *infos)     \
    {                                                                                     \
        return running_processes(device, infoCount, infos, kind, version);                \
    }

/* A driver before R510 has no _v3 calls; one before R450 no _v2 either. */
#if defined(FAKE_NVML_NO_V2) && !defined(FAKE_NVML_NO_V3)
#define FAKE_NVML_NO_V3
#endif
PROC_FN(nvmlDeviceGetComputeRunningProcesses, KIND_COMPUTE, 1)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses, KIND_GRAPHICS, 1)
#ifndef FAKE_NVML_NO_V2
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v2, KIND_COMPUTE, 2)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, KIND_GRAPHICS, 2)
#endif
#ifndef FAKE_NVML_NO_V3
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v3, KIND_COMPUTE, 3)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, KIND_GRAPHICS, 3)
#endif

/* ---- persistence mode ------------------------------------------------- */

#define NVML_FEATURE_DISABLED 0
#define NVML_FEATURE_ENABLED 1

API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!mode)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if ((r = fault(st, g->index, F_PERSIST)) == NVML_SUCCESS)
            *mode = st->persistence[g->index] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, int mode)
{
    char path[4096];
    struct state *st;
    struct gpu *g;
    FILE *f;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (mode != NVML_FEATURE_ENABLED && mode != NVML_FEATURE_DISABLED)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (geteuid() != 0)
        r = NVML_ERROR_NO_PERMISSION;
    else if ((r = fault(st, g->index, F_PERSIST)) == NVML_SUCCESS) {
        state_path(path, sizeof(path));
        f = fopen(path, "ae");
        if (!f)
            r = NVML_ERROR_UNKNOWN;
        else {
            fprintf(f, "persistence %u %s\n", g->index,
                    mode == NVML_FEATURE_ENABLED ? "on" : "off");
            if (fclose(f) != 0)
                r = NVML_ERROR_UNKNOWN;
        }
    }
    free(st);
    return r;
}

/* ---- MIG mode (the `mig` directive) ----------------------------------- */

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define FAKE_MAX_MIG_DEVICES 7
#define FAKE_NVML_ERROR_NOT_SUPPORTED ((nvmlReturn_t)3) /* nvml.h's NVML_ERROR_NOT_SUPPORTED */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!current || !pending) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!st->mig[g->index]) {
            r = FAKE_NVML_ERROR_NOT_SUPPORTED; /* as a GPU without MIG answers */
        } else {
            *current = *pending = NVML_DEVICE_MIG_ENABLE;
        }
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!count)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *count = st->mig[g->index] ? FAKE_MAX_MIG_DEVICES : 0;
    }
    free(st);
    return r;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *mig)
{
    struct state *st;
    struct gpu *g;
    nvmlReturn_t r = enter_dev(device, &st, &g);
    if (r == NVML_SUCCESS) {
        if (!mig)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!st->mig[g->index] || index + 1 >= (unsigned int)st->mig[g->index])
            r = NVML_ERROR_NOT_FOUND;
        else
            *mig = device; /* the parent's handle stands in: nothing else is asked of it */
    }
    free(st);
    return r;
}
