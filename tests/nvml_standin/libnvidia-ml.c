/*
 * A stand-in libnvidia-ml.so.1 for the tests: the NVML C functions the probe reaches through
 * pynvml, with nvml.h's signatures and structure layouts, answering like a healthy node.
 *
 * Built at test time once per driver branch (tests/test_nvml_standin.py): the build defines
 * HAVE_<function> for exactly the functions that branch exports
 * (healthcheck/data/nvml-functions.tsv), so pynvml finds the others missing, as it would on
 * that driver, and DRIVER_VERSION. What the node looks like comes from the environment:
 *   SGH_STANDIN_GPUS          number of GPUs (default 8)
 *   SGH_STANDIN_MODEL         "h100" (SXM, 18 NVLinks, NVSwitch fabric; default) or
 *                             "a100-pcie" (no NVLink bridge: 12 links present but down, no fabric)
 *   SGH_STANDIN_HANDLE_ERROR  "INDEX:CODE": nvmlDeviceGetHandleByIndex_v2(INDEX) returns CODE
 *                             (999 NVML_ERROR_UNKNOWN, 15 NVML_ERROR_GPU_IS_LOST)
 *   SGH_STANDIN_RECOVERY      "INDEX:VALUE": GPU INDEX's recovery action (field 230) is VALUE
 *   SGH_STANDIN_C2C           "LINKS:DOWN": every GPU has LINKS NVLink-C2C links (field 170), all
 *                             active (field 171, by scopeId) but GPU DOWN's link 0 (-1: none).
 *                             Default: no C2C links.
 *   SGH_STANDIN_FABRIC        "SUMMARY:MASK:CLIQUE": every GPU's fabric health summary and
 *                             mask (fabric info v3) and clique id; a non-zero clique also gives a
 *                             cluster UUID (a multi-node NVLink domain). Default "1:0:0" (no domain).
 *   SGH_STANDIN_MIG           "INDEX:COUNT": GPU INDEX is in MIG mode with COUNT MIG devices (at most
 *                             7; GPU instance ids 1.., compute instance 0, opaque MIG-<uuid> UUIDs);
 *                             every other GPU has MIG off. Default: MIG off everywhere.
 * Structure versions: the build defines ACCEPTS_<function>_V<version> for the versions the
 * branch accepts (healthcheck/data/nvml-struct-versions.tsv); another version is answered
 * NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
 * Field values: the build defines KNOWS_FIELD_<id> for the fields the branch knows
 * (healthcheck/data/nvml-fields.tsv); any other field is answered NOT_SUPPORTED in its slot.
 * Fabric structures are written as a driver may: the state byte is right and the padding
 * after it is not zero (nvmlGpuFabricState_t is an unsigned char).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef int nvmlEnableState_t;
typedef struct standin_gpu *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1
#define NVML_GPU_FABRIC_STATE_COMPLETED 3
#define MAX_GPUS 16

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {                      /* v1: R525 .. */
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

typedef struct {                      /* v2: R550 .. */
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

#define nvmlGpuFabricInfo_v2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2u << 24)))

typedef struct {                      /* v3: R570 .. (fabric health) */
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define nvmlGpuFabricInfo_v3 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3u << 24)))

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_FI_DEV_C2C_LINK_COUNT 170
#define NVML_FI_DEV_C2C_LINK_GET_STATUS 171
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

struct standin_gpu {
    unsigned int index;
    int parent;                       /* -1: a GPU; else a MIG device of GPU <parent> */
    unsigned int slot;                /* a MIG device's place on its parent */
};

#define MAX_MIG 7
static struct standin_gpu gpus[MAX_GPUS];
static struct standin_gpu migs[MAX_MIG];
static int mig_gpu = -1;
static unsigned int mig_count;
static unsigned int gpu_count;
static int initialised;
static int pcie_no_bridge;
static int failing_index = -1;
static nvmlReturn_t failing_code;
static int recovery_index = -1;
static unsigned int recovery_value;
static unsigned int c2c_links;
static int c2c_down = -1;
static unsigned int fabric_summary = 1, fabric_mask, fabric_clique;

static void configure(void) {
    const char *count = getenv("SGH_STANDIN_GPUS");
    const char *model = getenv("SGH_STANDIN_MODEL");
    const char *failing = getenv("SGH_STANDIN_HANDLE_ERROR");
    gpu_count = count ? (unsigned int)atoi(count) : 8;
    if (gpu_count > MAX_GPUS)
        gpu_count = MAX_GPUS;
    pcie_no_bridge = model && strcmp(model, "a100-pcie") == 0;
    failing_index = -1;
    if (failing && sscanf(failing, "%d:%d", &failing_index, &failing_code) != 2)
        failing_index = -1;
    const char *recovery = getenv("SGH_STANDIN_RECOVERY");
    recovery_index = -1;
    if (recovery && sscanf(recovery, "%d:%u", &recovery_index, &recovery_value) != 2)
        recovery_index = -1;
    const char *c2c = getenv("SGH_STANDIN_C2C");
    if (!c2c || sscanf(c2c, "%u:%d", &c2c_links, &c2c_down) != 2) {
        c2c_links = 0;
        c2c_down = -1;
    }
    const char *fabric = getenv("SGH_STANDIN_FABRIC");
    if (!fabric || sscanf(fabric, "%u:%u:%u", &fabric_summary, &fabric_mask, &fabric_clique) != 3) {
        fabric_summary = 1;
        fabric_mask = 0;
        fabric_clique = 0;
    }
    for (unsigned int i = 0; i < gpu_count; i++) {
        gpus[i].index = i;
        gpus[i].parent = -1;
    }
    const char *mig = getenv("SGH_STANDIN_MIG");
    mig_gpu = -1;
    mig_count = 0;
    if (!mig || sscanf(mig, "%d:%u", &mig_gpu, &mig_count) != 2 || mig_gpu < 0 || (unsigned int)mig_gpu >= gpu_count) {
        mig_gpu = -1;
        mig_count = 0;
    }
    if (mig_count > MAX_MIG)
        mig_count = MAX_MIG;
    for (unsigned int j = 0; j < mig_count; j++) {
        migs[j].index = (unsigned int)mig_gpu;
        migs[j].parent = mig_gpu;
        migs[j].slot = j;
    }
}

static nvmlReturn_t check(nvmlDevice_t device) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device != NULL && device >= migs && device < migs + mig_count)
        return NVML_SUCCESS;          /* a MIG device's handle */
    if (device == NULL || device < gpus || device >= gpus + gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define DEVICE_CALL(device) do { nvmlReturn_t r_ = check(device); if (r_) return r_; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    configure();
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Stand-in Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (length < sizeof(DRIVER_VERSION))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, DRIVER_VERSION);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)index == failing_index)
        return failing_code;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device);
    snprintf(name, length, "%s", pcie_no_bridge ? "NVIDIA A100 80GB PCIe" : "NVIDIA H100 80GB HBM3");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL(device);
    if (device->parent >= 0)          /* R470+: opaque, nothing in it names the parent */
        snprintf(uuid, length, "MIG-9c3e51b7-%04x-5000-9000-%012x", device->parent, device->slot);
    else
        snprintf(uuid, length, "GPU-57a0d1e0-0000-4000-8000-%012x", device->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(device);
    memset(pci, 0, sizeof(*pci));
    pci->bus = 0x18 + 0x10 * device->index;
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    pci->pciDeviceId = pcie_no_bridge ? 0x20b510de : 0x233010de;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_CALL(device);
    *minor = device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEVICE_CALL(device);
    *current = *pending = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    DEVICE_CALL(device);
    (void)errorType; (void)counterType;
    *count = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE_CALL(device);
    *corrRows = *uncRows = *isPending = *failureOccurred = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    DEVICE_CALL(device);
    (void)isPending;
    return NVML_ERROR_NOT_SUPPORTED;      /* Ampere and later remap rows instead */
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    DEVICE_CALL(device);
    (void)sensor;
    *temp = 34;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int threshold, unsigned int *temp) {
    DEVICE_CALL(device);
    if (threshold != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = 87;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    DEVICE_CALL(device);
    *milliwatts = 70000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    DEVICE_CALL(device);
    *milliwatts = pcie_no_bridge ? 300000 : 700000;
    return NVML_SUCCESS;
}

#ifdef HAVE_nvmlDeviceGetCurrentClocksThrottleReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_CALL(device);
    *reasons = 0;
    return NVML_SUCCESS;
}
#endif

#ifdef HAVE_nvmlDeviceGetCurrentClocksEventReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_CALL(device);
    *reasons = 0;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *value) {
    DEVICE_CALL(device);
    *value = pcie_no_bridge ? 4 : 5;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *value) {
    return nvmlDeviceGetCurrPcieLinkGeneration(device, value);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *value) {
    DEVICE_CALL(device);
    *value = 16;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *value) {
    return nvmlDeviceGetCurrPcieLinkWidth(device, value);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    DEVICE_CALL(device);
    if (link >= (pcie_no_bridge ? 12u : 18u))
        return NVML_ERROR_NOT_SUPPORTED;
    *active = pcie_no_bridge ? 0 : 1;     /* no bridge: present but down */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                             unsigned long long *value) {
    DEVICE_CALL(device);
    (void)counter;
    if (link >= (pcie_no_bridge ? 12u : 18u))
        return NVML_ERROR_NOT_SUPPORTED;
    *value = 0;
    return NVML_SUCCESS;
}

__attribute__((unused)) static void fill_fabric(unsigned char *state, nvmlReturn_t *status) {
    /* The byte after the state and the two after it are padding: leave them dirty. */
    memset(state, 0xA5, 4);
    *state = NVML_GPU_FABRIC_STATE_COMPLETED;
    *status = NVML_SUCCESS;
}

/* The domain: a cluster UUID and clique id only where SGH_STANDIN_FABRIC gives a clique. */
__attribute__((unused)) static void fill_domain(unsigned char *uuid, unsigned int *clique) {
    memset(uuid, fabric_clique ? 0x11 : 0, 16);
    *clique = fabric_clique;
}

#ifdef HAVE_nvmlDeviceGetGpuFabricInfo
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    DEVICE_CALL(device);
    if (pcie_no_bridge)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_domain(info->clusterUuid, &info->cliqueId);
    fill_fabric(&info->state, &info->status);
    return NVML_SUCCESS;
}
#endif

#ifdef HAVE_nvmlDeviceGetGpuFabricInfoV
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *arg) {
    DEVICE_CALL(device);
    unsigned int version = *(unsigned int *)arg;
#ifdef ACCEPTS_nvmlDeviceGetGpuFabricInfoV_V3
    if (version == nvmlGpuFabricInfo_v3) {
        nvmlGpuFabricInfo_v3_t *info = arg;
        if (pcie_no_bridge)
            return NVML_ERROR_NOT_SUPPORTED;
        fill_domain(info->clusterUuid, &info->cliqueId);
        fill_fabric(&info->state, &info->status);
        info->healthMask = fabric_mask;
        info->healthSummary = (unsigned char)fabric_summary;
        return NVML_SUCCESS;
    }
#endif
    if (version != nvmlGpuFabricInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpuFabricInfo_v2_t *info = arg;
    if (pcie_no_bridge)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_domain(info->clusterUuid, &info->cliqueId);
    fill_fabric(&info->state, &info->status);
    info->healthMask = 0;
    return NVML_SUCCESS;
}
#endif

/* No process holds a GPU: both versions answer "none" (their element layouts then do not matter). */
#ifdef HAVE_nvmlDeviceGetComputeRunningProcesses_v2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, void *infos) {
    DEVICE_CALL(device);
    (void)infos;
    *count = 0;
    return NVML_SUCCESS;
}
#endif

#ifdef HAVE_nvmlDeviceGetComputeRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, void *infos) {
    DEVICE_CALL(device);
    (void)infos;
    *count = 0;
    return NVML_SUCCESS;
}
#endif

/* Every branch has the call; which fields it answers is the branch's (KNOWS_FIELD_<id>). */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    DEVICE_CALL(device);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = 0;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
#ifdef KNOWS_FIELD_230
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (int)device->index == recovery_index ? recovery_value : 0;
            v->nvmlReturn = NVML_SUCCESS;
        }
#endif
#ifdef KNOWS_FIELD_170
        if (v->fieldId == NVML_FI_DEV_C2C_LINK_COUNT) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = c2c_links;
            v->nvmlReturn = NVML_SUCCESS;
        }
#endif
#ifdef KNOWS_FIELD_171
        if (v->fieldId == NVML_FI_DEV_C2C_LINK_GET_STATUS && v->scopeId < c2c_links) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = !((int)device->index == c2c_down && v->scopeId == 0);
            v->nvmlReturn = NVML_SUCCESS;
        }
#endif
    }
    return NVML_SUCCESS;
}

/* MIG (every branch modelled: MIG came with R450). MIG is off unless SGH_STANDIN_MIG names a GPU. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_CALL(device);
    if (device->parent >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = *pendingMode = (int)device->index == mig_gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_CALL(device);
    if (device->parent >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    DEVICE_CALL(device);
    if (device->parent >= 0 || (int)device->index != mig_gpu || index >= MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= mig_count)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    DEVICE_CALL(migDevice);
    if (migDevice->parent < 0)
        return NVML_ERROR_INVALID_ARGUMENT;     /* not a MIG device's handle */
    *device = &gpus[migDevice->parent];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    DEVICE_CALL(device);
    *isMigDevice = device->parent >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_CALL(device);
    if (device->parent < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = device->slot + 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_CALL(device);
    if (device->parent < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = 0;
    return NVML_SUCCESS;
}
