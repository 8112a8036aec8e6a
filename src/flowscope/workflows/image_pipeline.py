"""A real image-processing workflow for Dask, in the spirit of the ImageProcessing workflow of the Dask
provenance paper: generate images on disk, then read, normalise, grayscale, Gaussian-filter, segment and
write each, with per-batch means that pull images from several workers, submitted as three task graphs.

The demo and the overhead benchmark run it; it knows nothing of flowscope.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


def generate(i: int, outdir: str, size: int) -> str:
    """Write a synthetic RGB image of bright blobs on noise as .npy; returns its path."""
    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[0:size, 0:size]
    img = rng.normal(0.1, 0.05, (size, size, 3))
    for _ in range(12):
        cy, cx = rng.integers(0, size, 2)
        r = rng.integers(size // 40, size // 12)
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2.0 * r * r))
        img += blob[..., None] * rng.uniform(0.4, 1.0, 3)
    path = Path(outdir) / f"image-{i:04d}.npy"
    np.save(path, img.astype(np.float32))
    return str(path)


def read(path: str) -> np.ndarray:
    return np.load(path)


def normalise(img: np.ndarray) -> np.ndarray:
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo if hi > lo else 1.0)


def grayscale(img: np.ndarray) -> np.ndarray:
    return img @ np.array([0.299, 0.587, 0.114], dtype=img.dtype)


def gaussian(img: np.ndarray, sigma: float = 2.0) -> np.ndarray:
    from scipy import ndimage

    return ndimage.gaussian_filter(img, sigma)


def segment(img: np.ndarray) -> np.ndarray:
    """Label the connected regions brighter than the image's mean plus one standard deviation."""
    from scipy import ndimage

    labels, _ = ndimage.label(img > img.mean() + img.std())
    return labels.astype(np.int32)


def write(labels: np.ndarray, path: str) -> dict:
    """Write the segmentation next to its image; returns what was found."""
    out = Path(path).with_name(Path(path).stem + "-labels.npy")
    np.save(out, labels)
    return {"path": str(out), "objects": int(labels.max()), "nbytes": int(labels.nbytes)}


def batch_mean(*imgs: np.ndarray) -> np.ndarray:
    return np.mean(np.stack(imgs), axis=0)


def summarise(*means: np.ndarray) -> float:
    return float(np.mean([m.mean() for m in means]))


@dataclass
class PipelineResult:
    images: int
    objects: int
    written_bytes: int
    mean_intensity: float


def run_pipeline(client, workdir: str | Path, images: int = 32, size: int = 384, batch: int = 4) -> PipelineResult:
    """Run the workflow on ``client``'s cluster as three graphs: generate; process; aggregate."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    from distributed import wait

    ids = range(images)
    # graph 1: generate the images on disk
    paths = client.map(generate, ids, [str(workdir)] * images, [size] * images,
                       key=[f"generate-{i}" for i in ids])
    wait(paths)  # graph-to-graph synchronisation: processing starts from files that exist
    # graph 2: the per-image chain
    imgs = client.map(read, paths, key=[f"read-{i}" for i in ids])
    norm = client.map(normalise, imgs, key=[f"normalise-{i}" for i in ids])
    gray = client.map(grayscale, norm, key=[f"grayscale-{i}" for i in ids])
    blur = client.map(gaussian, gray, key=[f"gaussian-{i}" for i in ids])
    segs = client.map(segment, blur, key=[f"segment-{i}" for i in ids])
    done = client.map(write, segs, paths, key=[f"write-{i}" for i in ids])
    found = client.gather(done)
    # graph 3: means over batches of images, wherever they were computed, then one summary
    means = [client.submit(batch_mean, *blur[b:b + batch], key=f"batch-mean-{b // batch}")
             for b in range(0, images, batch)]
    mean_intensity = client.submit(summarise, *means, key="summarise").result()
    return PipelineResult(images=images, objects=sum(f["objects"] for f in found),
                          written_bytes=sum(f["nbytes"] for f in found), mean_intensity=mean_intensity)
