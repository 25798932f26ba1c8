"""app.engine.device: the device in words, with MLX's device API faked (CUDA, Metal, CPU)."""

from __future__ import annotations

from types import SimpleNamespace

from app.cli import version_text
from app.engine import device


def fake_mx(kind: str, info=None, cuda=False, metal=False, raises=False):
    """A stand-in for ``mlx.core`` with the attributes :mod:`app.engine.device` reads."""
    cpu, gpu = "Device(cpu, 0)", "Device(gpu, 0)"

    def device_info():
        if raises:
            raise RuntimeError("no device info here")
        return info or {}

    return SimpleNamespace(
        cpu=cpu, gpu=gpu, default_device=lambda: cpu if kind == "cpu" else gpu,
        device_info=device_info,
        metal=SimpleNamespace(is_available=lambda: metal),
        cuda=SimpleNamespace(is_available=lambda: cuda),
    )


def test_cuda_device_shows_its_name_and_backend():
    mx = fake_mx("gpu", {"device_name": "NVIDIA H200", "total_memory": 150_000_000_000},
                 cuda=True)
    assert device.backend(mx) == "CUDA"
    assert device.device_description(mx) == "Device(gpu, 0): NVIDIA H200 (CUDA)"


def test_metal_without_a_name_falls_back_to_the_architecture():
    mx = fake_mx("gpu", {"architecture": "applegpu_g15s", "memory_size": 1}, metal=True)
    assert device.device_description(mx) == "Device(gpu, 0): applegpu_g15s (Metal)"


def test_cpu_and_a_failing_device_info():
    assert device.device_description(fake_mx("cpu", {"device_name": "Xeon"})) == (
        "Device(cpu, 0): Xeon (CPU)")
    assert device.device_description(fake_mx("cpu", raises=True)) == "Device(cpu, 0) (CPU)"
    # a GPU whose backend neither Metal nor CUDA claims
    assert device.device_description(fake_mx("gpu")) == "Device(gpu, 0) (GPU)"


def test_version_text_names_the_device(monkeypatch):
    import mlx.core as mx

    monkeypatch.setattr(mx, "device_info", lambda *a: {"device_name": "NVIDIA H200"})
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu, 0))
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    line = [ln for ln in version_text().splitlines() if ln.startswith("mlx ")][0]
    assert line == f"mlx {mx.__version__} (device: Device(gpu, 0): NVIDIA H200 (CUDA))"


def test_version_text_says_when_compiled_layers_are_on(monkeypatch):
    """``DFLASH_COMPILE_LAYERS=1`` takes effect only with the CUDA GDN kernel active; the
    version text says when it does, and nothing otherwise (this CPU)."""
    from app.engine.kernels import gdn_kernel

    monkeypatch.setenv("DFLASH_COMPILE_LAYERS", "1")
    assert not any(ln.startswith("target layers:") for ln in version_text().splitlines())
    monkeypatch.setattr(gdn_kernel, "_on_cuda", lambda: True)
    assert "target layers: mx.compile programs (DFLASH_COMPILE_LAYERS=1; exact)" \
        in version_text().splitlines()
    monkeypatch.setenv("DFLASH_COMPILE_LAYERS", "0")
    assert not any(ln.startswith("target layers:") for ln in version_text().splitlines())


def test_a_shadowed_cuda_wheel_is_named_with_its_fix():
    cpu = fake_mx("cpu", {"device_name": "Xeon"})
    both = {"mlx-cpu": "0.32.4", "mlx-cuda-13": "0.32.4"}.get
    msg = device.backend_problem(cpu, installed=both)
    assert msg.startswith("mlx-cuda-13 0.32.4 is installed but MLX runs on the CPU")
    assert "pip uninstall -y mlx-cpu && pip install --force-reinstall --no-deps " \
           "mlx-cuda-13==0.32.4" in msg
    only_cuda = {"mlx-cuda-13": "0.32.4"}.get
    assert "no CUDA device is visible" in device.backend_problem(cpu, installed=only_cuda)
    gpu = fake_mx("gpu", {"device_name": "NVIDIA H200"}, cuda=True)
    assert device.backend_problem(gpu, installed=both) is None  # the CUDA library won
    assert device.backend_problem(cpu, installed={"mlx-cpu": "0.32.4"}.get) is None


def test_version_text_warns_when_the_cpu_wheel_shadows_cuda(monkeypatch):
    monkeypatch.setattr(device, "_installed_version",
                        {"mlx-cpu": "0.32.4", "mlx-cuda-13": "0.32.4"}.get)
    lines = version_text().splitlines()
    assert any(ln.startswith("warning: mlx-cuda-13 0.32.4 is installed") for ln in lines)
    monkeypatch.setattr(device, "_installed_version", {"mlx-cpu": "0.32.4"}.get)
    assert not any(ln.startswith("warning:") for ln in version_text().splitlines())


def test_cudnn_attention_is_turned_off_on_cuda_only_and_never_over_the_users_choice():
    env: dict = {}
    assert device.configure_cuda_attention(fake_mx("gpu", cuda=True), env) is True
    assert env == {device.CUDNN_SDPA_ENV: "0"}
    mine = {device.CUDNN_SDPA_ENV: "1"}
    assert device.configure_cuda_attention(fake_mx("gpu", cuda=True), mine) is False
    assert mine == {device.CUDNN_SDPA_ENV: "1"}
    for mx in (fake_mx("gpu", metal=True), fake_mx("cpu")):
        env = {}
        assert device.configure_cuda_attention(mx, env) is False and env == {}


def test_kernel_cache_goes_to_the_users_cache_folder_on_cuda_only(tmp_path):
    env: dict = {}
    gpu = fake_mx("gpu", cuda=True)
    assert device.configure_cuda_kernel_cache(gpu, env, folder=tmp_path) == str(tmp_path)
    assert env == {device.PTX_CACHE_ENV: str(tmp_path)}
    mine = {device.PTX_CACHE_ENV: "/somewhere/else"}
    assert device.configure_cuda_kernel_cache(gpu, mine, folder=tmp_path) is None
    assert mine == {device.PTX_CACHE_ENV: "/somewhere/else"}
    for mx in (fake_mx("gpu", metal=True), fake_mx("cpu")):
        env = {}
        assert device.configure_cuda_kernel_cache(mx, env, folder=tmp_path) is None
        assert env == {}


def test_kernel_cache_default_folder_is_per_mlx_version_and_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    gpu = fake_mx("gpu", {"architecture": "sm 90/x"}, cuda=True)
    gpu.__version__ = "9.9.9"
    env: dict = {}
    want = tmp_path / "mlx-kernels" / "9.9.9-sm_90_x"
    assert device.configure_cuda_kernel_cache(gpu, env) == str(want) and want.is_dir()


def test_kernel_cache_is_left_to_mlx_when_the_folder_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env: dict = {}
    gpu = fake_mx("gpu", cuda=True)
    assert device.configure_cuda_kernel_cache(gpu, env, folder=blocker / "cache") is None
    assert env == {}
