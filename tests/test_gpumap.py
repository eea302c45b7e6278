"""GRES index -> NVML index through the device files' minor numbers."""
import os
import stat

import pytest

from slurm_hooks.gpumap import device_minors, devices_dir, gres_to_nvml, parse_gpu_list


def test_parse_gpu_list():
    assert parse_gpu_list("3,4") == [3, 4]
    assert parse_gpu_list("0-2,5") == [0, 1, 2, 5]
    assert parse_gpu_list(None) is None and parse_gpu_list("") is None
    with pytest.raises(ValueError):
        parse_gpu_list("3,x")


def make_devices(directory, minors):
    for number, minor in enumerate(minors):
        os.mknod(str(directory / f"nvidia{number}"), 0o600 | stat.S_IFCHR, os.makedev(195, minor))


def test_device_files_in_slurm_order_with_their_minor_numbers(tmp_path):
    make_devices(tmp_path, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    (tmp_path / "nvidiactl").write_text("")                # not a GPU
    (tmp_path / "nvidia11").write_text("")                 # not a character device
    os.symlink(str(tmp_path / "nvidia0"), str(tmp_path / "nvidia12"))   # links are not followed
    devices = device_minors(str(tmp_path))
    assert [name for name, _ in devices] == [f"nvidia{n}" for n in range(11)]   # 10 after 9
    assert devices[10] == ("nvidia10", 10)


def test_gres_order_differs_from_nvml_order():
    # The driver numbered the devices against PCI order: NVML GPU i has minor 7 - i.
    devices = [(f"nvidia{n}", n) for n in range(8)]
    nvml_minors = {i: 7 - i for i in range(8)}
    assert gres_to_nvml([0, 1], devices, nvml_minors) == ([7, 6], "minor")
    assert gres_to_nvml([5], devices, nvml_minors) == ([2], "minor")


def test_identity_when_the_mapping_cannot_be_made():
    devices = [(f"nvidia{n}", n) for n in range(2)]
    assert gres_to_nvml([1], [], {0: 0})[1].startswith("identity")
    assert gres_to_nvml([1], devices, {})[1].startswith("identity")
    assert gres_to_nvml([3], devices, {0: 0, 1: 1}) == ([3], "identity (GRES index 3 but only 2 device files)")
    assert gres_to_nvml([1], devices, {0: 0, 1: 9})[1] == "identity (no NVML GPU has minor number 1)"


def test_a_gpu_whose_minor_nvml_cannot_read_is_the_one_judged():
    """A GPU that fell off the bus answers no NVML call, its minor number neither."""
    devices = [(f"nvidia{n}", n) for n in range(8)]
    nvml_minors = {i: 7 - i for i in range(7)}
    nvml_minors[7] = None                                   # NVML GPU 7 (/dev/nvidia0) is lost
    assert gres_to_nvml([0], devices, nvml_minors) == ([7], "minor, unreadable")
    assert gres_to_nvml([1], devices, nvml_minors) == ([6], "minor")


def test_devices_dir_per_node():
    assert devices_dir("/var/lab/fakedev/{node}", "gpu2") == "/var/lab/fakedev/gpu2"
    assert devices_dir("/dev", "gpu2") == "/dev"
