"""Tensor libraries behind ``ferrio.safetensors``: buffers, dtype views and byte access.

Each framework turns a device string into an allocator of one ``uint8`` buffer, builds a typed,
shaped view of a byte range of it, and exposes a tensor's bytes for writing. The libraries are
imported only when a framework is used, so none is a dependency of ferrio.
"""

from __future__ import annotations

from typing import Any

import ferrio.config
from ferrio._native import SafetensorError
from ferrio.safetensors import _pinned

# safetensors name -> torch attribute name; looked up with getattr so that older torch works.
_TORCH_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}

# safetensors name -> numpy dtype name: the types numpy has (as safetensors.numpy).
_NUMPY_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}

# Types numpy lacks but `ml_dtypes` (JAX's numpy extension) adds, used when it is installed.
_ML_DTYPES_NAMES = {
    "BF16": "bfloat16",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}

FRAMEWORKS = ("pt", "torch", "pytorch", "numpy", "np", "cupy", "cp")


def numpy_dtype(np: Any, dtype: str) -> Any:
    """Return the numpy dtype of safetensors' `dtype`, or None.

    numpy's own types, and bfloat16 and the float8 types where `ml_dtypes` is installed.
    """
    if dtype in _NUMPY_NAMES:
        return np.dtype(_NUMPY_NAMES[dtype])
    if dtype in _ML_DTYPES_NAMES:
        try:
            import ml_dtypes  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return None
        kind = getattr(ml_dtypes, _ML_DTYPES_NAMES[dtype], None)
        return None if kind is None else np.dtype(kind)
    return None


def safetensors_dtype(dtype: Any) -> str | None:
    """Return the safetensors name of a numpy dtype, or None."""
    for table in (_NUMPY_NAMES, _ML_DTYPES_NAMES):
        for st_name, np_name in table.items():
            if dtype.name == np_name:
                return st_name
    return None


def parse_device(device: Any) -> tuple[str, int | None]:
    """Return ``("cpu", None)`` or ``("cuda", index or None for the current device)``."""
    if isinstance(device, bool):
        raise SafetensorError(f"device must be 'cpu', 'cuda', 'cuda:N' or an int, not {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise SafetensorError(f"device index must be at least 0, not {device}")
        return "cuda", device
    text = str(device)  # also takes torch.device
    if text == "cpu":
        return "cpu", None
    if text == "cuda":
        return "cuda", None
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise SafetensorError(f"device must be 'cpu', 'cuda', 'cuda:N' or an int, not {device!r}")


class Framework:
    """One tensor library on one device."""

    name: str

    def __init__(self, device: Any) -> None:
        self.kind, self.index = parse_device(device)

    def empty(self, nbytes: int) -> Any:
        """Return a new uint8 buffer of `nbytes` on the device."""
        raise NotImplementedError

    def tensor_buffer(self, nbytes: int) -> Any:
        """Return a new uint8 buffer of `nbytes` for one tensor that ``safe_open`` reads.

        As :meth:`empty`, except where the library can pin host memory (see :class:`Torch`).
        """
        return self.empty(nbytes)

    def handed_out(self, tensor: Any) -> None:
        """Note a tensor read by :meth:`tensor_buffer`'s caller and given to the user."""

    def read_ahead_window(self, window: int) -> int:
        """Return the bytes to read ahead of ``get_tensor`` calls, given the setting's."""
        return window

    def target(self, buf: Any, begin: int, end: int) -> Any:
        """Return what ``File.pread`` fills for bytes `begin`..`end` of `buf`."""
        raise NotImplementedError

    def view(self, buf: Any, begin: int, end: int, dtype: str, shape: list[int]) -> Any:
        """Return bytes `begin`..`end` of `buf` as a tensor; copied if misaligned."""
        raise NotImplementedError

    def check_dtype(self, name: str, dtype: str) -> None:
        """Raise TypeError when this library has no type for `dtype` (as safetensors does)."""
        raise NotImplementedError


def _misaligned(begin: int, dtype_bytes: int) -> bool:
    return dtype_bytes > 1 and begin % dtype_bytes != 0


class Torch(Framework):
    """PyTorch tensors on the CPU or a GPU."""

    name = "pt"

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.torch = torch
        # Where host tensors read one at a time may be pinned (see `_pinned`): the setting as
        # it was when the framework was made (at the file's open); 0 on a GPU, never pinned.
        self.pinned_limit = 0
        if self.kind == "cpu":
            self.pinned_limit = int(ferrio.config.get("pinned_tensor_limit"))
            self.device = torch.device("cpu")
        elif self.index is None:
            self.device = torch.device("cuda")
        else:
            self.device = torch.device("cuda", self.index)

    def dtype(self, name: str) -> Any:
        attr = _TORCH_NAMES.get(name)
        dt = getattr(self.torch, attr, None) if attr else None
        if dt is None:
            raise TypeError(f"this torch has no dtype for safetensors' {name}")
        return dt

    def check_dtype(self, name: str, dtype: str) -> None:
        try:
            self.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"tensor {name!r}: {e}") from None

    def empty(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def tensor_buffer(self, nbytes: int) -> Any:
        """Return a host buffer in pinned memory where `_pinned` allows it, else as `empty`."""
        if self.pinned_limit > 0:
            buf = _pinned.HOST.buffer(self.torch, nbytes, self.pinned_limit)
            if buf is not None:
                return buf
        return self.empty(nbytes)

    def handed_out(self, tensor: Any) -> None:
        if self.pinned_limit > 0:
            _pinned.HOST.handed_out(tensor)

    def read_ahead_window(self, window: int) -> int:
        if self.pinned_limit > 0 and _pinned.HOST.pins(self.torch):
            return min(window, _pinned.WINDOW)
        return window

    def target(self, buf: Any, begin: int, end: int) -> Any:
        part = buf[begin:end]
        # A host tensor has no buffer protocol; its numpy view shares the memory.
        return part.numpy() if part.device.type == "cpu" else part

    def view(self, buf: Any, begin: int, end: int, dtype: str, shape: list[int]) -> Any:
        dt = self.dtype(dtype)
        part = buf[begin:end]
        if _misaligned(begin, dt.itemsize):
            part = part.clone()
        return part.view(dt).reshape(shape)


class Numpy(Framework):
    """numpy arrays in host memory."""

    name = "numpy"

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        if self.kind != "cpu":
            raise ValueError(f"framework 'numpy' holds host memory only, not device {device!r}")
        import numpy

        self.np = numpy

    def check_dtype(self, name: str, dtype: str) -> None:
        if numpy_dtype(self.np, dtype) is None:
            raise TypeError(
                f"tensor {name!r}: numpy has no dtype for safetensors' {dtype} "
                "(bfloat16 and float8 need the ml_dtypes package)"
            )

    def empty(self, nbytes: int) -> Any:
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def target(self, buf: Any, begin: int, end: int) -> Any:
        return buf[begin:end]

    def view(self, buf: Any, begin: int, end: int, dtype: str, shape: list[int]) -> Any:
        dt = numpy_dtype(self.np, dtype)
        part = buf[begin:end]
        if _misaligned(begin, dt.itemsize):
            part = part.copy()
        return part.view(dt).reshape(shape)


class Cupy(Numpy):
    """CuPy arrays on a GPU."""

    name = "cupy"

    def __init__(self, device: Any) -> None:
        Framework.__init__(self, device)
        if self.kind != "cuda":
            raise ValueError("framework 'cupy' holds GPU memory: use device 'cuda' or 'cuda:N'")
        import cupy  # type: ignore[import-not-found, unused-ignore]

        self.np = cupy

    def empty(self, nbytes: int) -> Any:
        if self.index is None:
            return self.np.empty(nbytes, dtype=self.np.uint8)
        with self.np.cuda.Device(self.index):
            return self.np.empty(nbytes, dtype=self.np.uint8)


def framework(name: str, device: Any) -> Framework:
    """Return the framework called `name` on `device`."""
    if name in ("pt", "torch", "pytorch"):  # the names safetensors takes for torch
        return Torch(device)
    if name in ("numpy", "np"):
        return Numpy(device)
    if name in ("cupy", "cp"):
        return Cupy(device)
    raise SafetensorError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {name!r}")


def to_bytes(name: str, tensor: Any) -> tuple[str, list[int], Any]:
    """Return ``(dtype, shape, bytes object for File.pwrite)`` of a torch, numpy or CuPy tensor.

    The bytes object is a flat uint8 view of the tensor's memory (host: buffer protocol; GPU:
    ``__cuda_array_interface__``), never a copy, except for a non-contiguous numpy or CuPy
    array, which is packed first.
    """
    # The library of the tensor's class, or of the first base class of a known library: a
    # subclass defined elsewhere (`class Param(np.ndarray)`) is still a numpy array.
    roots = (c.__module__.split(".")[0] for c in type(tensor).__mro__)
    module = next((r for r in roots if r in ("torch", "numpy", "cupy")), "")
    if module == "torch":
        return _torch_bytes(name, tensor)
    if module in ("numpy", "cupy"):
        xp = __import__(module)
        if tensor.dtype.byteorder == ">":
            tensor = tensor.byteswap().view(tensor.dtype.newbyteorder("<"))
        arr = xp.ascontiguousarray(tensor)
        dtype = safetensors_dtype(arr.dtype)
        if dtype is None:
            raise SafetensorError(f"tensor {name!r}: safetensors has no dtype for {arr.dtype}")
        # ascontiguousarray makes a 0-d array 1-d: the shape comes from the original.
        return dtype, [int(d) for d in tensor.shape], arr.reshape(-1).view(xp.uint8)
    raise ValueError(
        f"tensor {name!r}: expected a torch tensor or a numpy or CuPy array, "
        f"not {type(tensor).__name__}"
    )


def _torch_bytes(name: str, tensor: Any) -> tuple[str, list[int], Any]:
    import torch  # type: ignore[import-not-found, unused-ignore]

    if tensor.layout != torch.strided:
        raise ValueError(f"tensor {name!r}: sparse tensors cannot be saved; use .to_dense()")
    if not tensor.is_contiguous():
        # As safetensors.torch: packing silently could hide a view of a larger tensor.
        raise ValueError(
            f"You are trying to save a non contiguous tensor: `{name}` which is not allowed; "
            "call `.contiguous()` on it first."
        )
    names = {getattr(torch, v): k for k, v in _TORCH_NAMES.items() if hasattr(torch, v)}
    dtype = names.get(tensor.dtype)
    if dtype is None:
        raise SafetensorError(f"tensor {name!r}: safetensors has no dtype for {tensor.dtype}")
    # detach: a tensor that requires grad (an nn.Parameter) has no numpy() nor
    # __cuda_array_interface__; safetensors.torch saves it, so do we.
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    data = flat.numpy() if flat.device.type == "cpu" else flat
    return dtype, [int(d) for d in tensor.shape], data


def overlapping(areas: list[tuple[int, int, str]]) -> list[list[str]]:
    """Group the names of (start, end, name) memory areas, sorted, whose spans overlap."""
    groups: list[list[str]] = []
    reach = -1
    for start, end, name in areas:
        if groups and start < reach:
            groups[-1].append(name)
            reach = max(reach, end)
        else:
            groups.append([name])
            reach = end
    return groups


def check_not_shared(tensors: dict[str, Any]) -> None:
    """Refuse torch tensors whose memory overlaps, as ``safetensors.torch.save_file`` does."""
    by_device: dict[str, list[tuple[int, int, str]]] = {}
    for name, t in tensors.items():
        if type(t).__module__.split(".")[0] != "torch" or t.device.type == "meta":
            continue
        nbytes = t.numel() * t.element_size()
        if nbytes:
            by_device.setdefault(str(t.device), []).append(
                (t.data_ptr(), t.data_ptr() + nbytes, name)
            )
    for areas in by_device.values():
        for group in overlapping(sorted(areas)):
            if len(group) > 1:
                raise RuntimeError(
                    f"Some tensors share memory: {group[0]!r} and {group[1]!r}; saving both would "
                    "duplicate it on disk. Save one, or clone them; a module's tied weights are "
                    "saved once by ferrio.safetensors.torch.save_model(model, filename)."
                )


__all__ = [
    "FRAMEWORKS",
    "Framework",
    "SafetensorError",
    "check_not_shared",
    "framework",
    "overlapping",
]
