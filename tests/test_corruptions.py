"""The CIFAR-10-C / MNIST-C corruptions: each against its definition on a hand-checked case or
its noise statistics, severity monotone, seeded."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from clusterfed.data import corruptions as cx
from clusterfed.data import load_dataset
from clusterfed.data.transforms import Corrupt

pytestmark = pytest.mark.fast


def constant(value: float, shape: tuple[int, ...] = (50, 1, 32, 32)) -> np.ndarray:
    return np.full(shape, value)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def big_digits() -> np.ndarray:
    """40 digits enlarged 4x to 32x32 (the size the CIFAR-10-C parameters are for), in [0, 1],
    by linear interpolation (not 4x4 blocks, which some pixelations would leave unchanged)."""
    x = load_dataset("digits").train_x[:40].astype(np.float64) / 255.0
    return np.clip(ndimage.zoom(x, (1, 1, 4, 4), order=1), 0.0, 1.0)


def test_contrast_pulls_each_channel_towards_its_mean():
    # Two channels of one image, means 0.3 and 0.8; severity 2 of CIFAR-10-C: factor 0.5.
    x = np.array([[[[0.0, 0.2], [0.4, 0.6]], [[0.6, 0.8], [0.8, 1.0]]]])
    out = cx.corrupt(x, "contrast", 2, rng())
    np.testing.assert_allclose(out[0, 0], [[0.15, 0.25], [0.35, 0.45]])
    np.testing.assert_allclose(out[0, 1], [[0.7, 0.8], [0.8, 0.9]])
    # MNIST-C severity 5: factor 0.05.
    np.testing.assert_allclose(cx.corrupt(x, "contrast", 5, rng(), "mnist_c")[0, 0],
                               [[0.285, 0.295], [0.305, 0.315]])


def test_brightness_raises_hsv_value_keeping_hue_and_saturation():
    x = np.array([[[[0.2, 0.0, 0.95]], [[0.4, 0.0, 0.5]], [[0.8, 0.0, 0.1]]]])  # (1, 3, 1, 3)
    out = cx.corrupt(x, "brightness", 2, rng())                                 # V + 0.1
    for j in range(3):
        h, s, v = colorsys.rgb_to_hsv(*x[0, :, 0, j])
        expected = colorsys.hsv_to_rgb(h, s, min(v + 0.1, 1.0))
        np.testing.assert_allclose(out[0, :, 0, j], expected, atol=1e-12)
    np.testing.assert_allclose(out[0, :, 0, 0], [0.225, 0.45, 0.9])           # x 0.9 / 0.8
    np.testing.assert_allclose(out[0, :, 0, 1], [0.1, 0.1, 0.1])              # black -> grey
    grey = np.array([[[0.0, 0.5, 0.95]]])                                     # (N, H, W)
    np.testing.assert_allclose(cx.corrupt(grey, "brightness", 5, rng()), [[[0.3, 0.8, 1.0]]])


@pytest.mark.parametrize(("table", "severity"), [("cifar10_c", 3), ("mnist_c", 2)])
def test_gaussian_and_speckle_noise_have_the_published_deviation(table, severity):
    sigma = cx.TABLES[table]["gaussian_noise"][severity - 1]
    noise = cx.corrupt(constant(0.5), "gaussian_noise", severity, rng(), table) - 0.5
    assert abs(noise.mean()) < 0.003 and noise.std() == pytest.approx(sigma, rel=0.02)
    sigma = cx.TABLES[table]["speckle_noise"][severity - 1]
    noise = cx.corrupt(constant(0.5), "speckle_noise", severity, rng(), table) - 0.5
    assert noise.std() == pytest.approx(0.5 * sigma, rel=0.02)                 # x N(0, s^2)


def test_shot_noise_is_poisson_in_photon_counts():
    # CIFAR-10-C severity 3: 100 photons at full intensity, so 50 at 0.5: mean 0.5, var 50/100^2.
    out = cx.corrupt(constant(0.5), "shot_noise", 3, rng())
    counts = out * 100
    np.testing.assert_allclose(counts, np.rint(counts), atol=1e-9)
    assert out.mean() == pytest.approx(0.5, abs=0.002)
    assert out.var() == pytest.approx(0.005, rel=0.03)


def test_impulse_noise_sets_the_published_share_to_salt_or_pepper():
    out = cx.corrupt(constant(0.5), "impulse_noise", 5, rng())                 # amount 0.07
    hit = out != 0.5
    assert set(np.unique(out[hit]).tolist()) == {0.0, 1.0}
    assert hit.mean() == pytest.approx(0.07, abs=0.002)
    assert (out[hit] == 1.0).mean() == pytest.approx(0.5, abs=0.02)


def test_gaussian_blur_of_a_point_is_the_sampled_gaussian():
    x = np.zeros((1, 1, 15, 15))
    x[0, 0, 7, 7] = 1.0
    sigma = cx.TABLES["cifar10_c"]["gaussian_blur"][4]                         # 1.0
    out = cx.corrupt(x, "gaussian_blur", 5, rng())[0, 0]
    # Separable, each axis exp(-t^2 / 2 sigma^2) for |t| <= 4 sigma (scikit-image's truncation).
    one_axis = np.exp(-(np.arange(-4, 5) ** 2) / (2 * sigma ** 2))
    np.testing.assert_allclose(out[3:12, 3:12], np.outer(one_axis, one_axis) / one_axis.sum() ** 2)
    assert out[7, 8] / out[7, 7] == pytest.approx(np.exp(-0.5))
    assert out.sum() == pytest.approx(1.0)


def test_defocus_disk_and_blur():
    # Radius 1 with alias blur 0.1: the 3-tap Gaussian is all but a point, the disk a cross.
    cross = cx.disk_kernel(1.0, 0.1)
    assert cross.shape == (17, 17)
    np.testing.assert_allclose(cross[7:10, 7:10], [[0, 0.2, 0], [0.2, 0.2, 0.2], [0, 0.2, 0]],
                               atol=1e-12)
    # Radius 0.3: the centre only, smoothed by OpenCV's 3-tap kernel of deviation 0.4.
    taps = np.exp(-np.array([1.0, 0.0, 1.0]) / (2 * 0.4 ** 2))
    taps /= taps.sum()
    np.testing.assert_allclose(cx.disk_kernel(0.3, 0.4)[7:10, 7:10], np.outer(taps, taps))
    x = np.zeros((1, 1, 20, 20))
    x[0, 0, 9, 9] = 1.0
    out = cx.corrupt(x, "defocus_blur", 4, rng())[0, 0]                        # (1, 0.2)
    np.testing.assert_allclose(out[8:11, 8:11], cx.disk_kernel(1.0, 0.2)[7:10, 7:10])


def test_pixelate_is_pils_box_resize():
    r = rng(1)
    halves = np.array([[[[0.0, 0.2, 0.4, 0.4], [0.2, 0.2, 0.4, 0.4],
                         [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.8]]]])
    # 4x4 at factor 0.5: 2x2 block means, enlarged back by nearest neighbour.
    out = cx.pixelate(halves, 0.5, r)[0, 0]
    np.testing.assert_allclose(out, np.kron([[0.15, 0.4], [1.0, 0.2]], np.ones((2, 2))))
    for size, factor in [(32, 0.65), (32, 0.95), (28, 0.25), (8, 0.85)]:
        img = r.integers(0, 256, (size, size)).astype(np.uint8)
        small = int(size * factor)
        pil = np.asarray(Image.fromarray(img).resize((small, small), Image.BOX)
                         .resize((size, size), Image.BOX), dtype=np.float64)
        mine = cx.pixelate(img[None].astype(np.float64) / 255, factor, r)[0] * 255
        assert np.abs(mine - pil).max() <= 1.0 + 1e-9       # PIL rounds between its passes
        # The same weights with PIL's rounding after each one-axis pass: equal.
        down, up = cx.box_resize_matrix(size, small), cx.box_resize_matrix(small, size)
        rounded = np.floor(down @ np.floor(img @ down.T + 0.5) + 0.5)
        np.testing.assert_array_equal(np.floor(up @ np.floor(rounded @ up.T + 0.5) + 0.5), pil)


@pytest.mark.parametrize("table", list(cx.TABLES))
@pytest.mark.parametrize("name", list(cx.CORRUPTIONS))
def test_severity_is_monotone(big_digits, name, table):
    """Mean absolute change from the clean images grows with the severity."""
    change = [np.abs(cx.corrupt(big_digits, name, s, rng(7), table) - big_digits).mean()
              for s in cx.SEVERITIES]
    assert all(a < b for a, b in zip(change, change[1:], strict=False)), change


def test_corrupt_transform_is_seeded_and_keeps_the_dtype():
    x = (load_dataset("digits").train_x[:30]).copy()
    a = Corrupt("gaussian_noise", 5, (3, 1, 0)).apply_x(x)
    np.testing.assert_array_equal(a, Corrupt("gaussian_noise", 5, (3, 1, 0)).apply_x(x))
    assert a.dtype == np.uint8 and not np.array_equal(
        a, Corrupt("gaussian_noise", 5, (3, 2, 0)).apply_x(x))
    # uint8: CIFAR-10-C's truncation to whole grey levels of the [0, 1] result.
    expected = cx.corrupt(x / 255.0, "gaussian_noise", 5, np.random.default_rng([3, 1, 0]))
    np.testing.assert_array_equal(a, (expected * 255).astype(np.uint8))
    floats = x.astype(np.float32) / 255
    out = Corrupt("contrast", 1, (0,)).apply_x(floats)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, cx.corrupt(floats, "contrast", 1, rng()), atol=1e-6)
    tokens = np.arange(12).reshape(3, 4)                       # not images: unchanged
    assert Corrupt("contrast", 1, (0,)).apply_x(tokens) is tokens
