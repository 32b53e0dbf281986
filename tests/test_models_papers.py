"""The papers' models: output shapes and parameter counts against the reference architectures
(each count is computed by hand from the architecture below and, where one is published, checked
against the published number), the split ResNet-18's reassembly of the parties' feature maps,
and the depth knob ``party.num_layers``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CONF_DIR, compose_config
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from vfl_lightning.models import (
    CNNEncoder,
    CreditServerHead,
    FedBCDCNN,
    MLPEncoder,
    ResNet18Body,
    ResNet18Encoder,
    ResNet18Stem,
    VGG13Head,
)
from vfl_lightning.models.heads import WeightNormLinear
from vfl_lightning.models.pn import PolynomialNetwork


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def conv(c_in: int, c_out: int, k: int = 3, bias: bool = False) -> int:
    return c_in * c_out * k * k + (c_out if bias else 0)


def bn(c: int) -> int:
    return 2 * c  # weight and bias (running statistics are buffers)


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def resnet18_stages() -> int:
    """The four stages of ResNet-18 (He et al. 2016, Table 1, two basic blocks per stage)."""
    total, c_in = 0, 64
    for width in (64, 128, 256, 512):
        for _ in range(2):
            total += conv(c_in, width) + bn(width) + conv(width, width) + bn(width)
            if c_in != width:  # the first block of stages 2-4: a 1x1 projection shortcut
                total += conv(c_in, width, k=1) + bn(width)
            c_in = width
    return total


def test_resnet18_counts_match_the_cifar10_resnet18():
    """3x3 stem conv + BN, the stages, FC 512 -> 10: 11,173,962 parameters, the count published
    for the CIFAR-10 ResNet-18 (e.g. the kuangliu/pytorch-cifar model)."""
    by_hand = conv(3, 64) + bn(64) + resnet18_stages() + linear(512, 10)
    assert by_hand == 11_173_962
    with torch.device("meta"):  # counting needs no memory
        assert count(ResNet18Encoder((3, 32, 32), embedding_dim=10)) == by_hand
        # a party's 1-channel slice with P = 64: only the stem and the last layer change
        expected = conv(1, 64) + bn(64) + resnet18_stages() + linear(512, 64)
        assert count(ResNet18Encoder((1, 16, 16), embedding_dim=64)) == expected


@pytest.mark.parametrize("shape", [(3, 16, 16), (1, 8, 8), (5, 9, 13), (3, 8, 32)])
def test_resnet18_party_embeds_any_slice(shape):
    model = ResNet18Encoder(shape, embedding_dim=7, output_activation="tanh").eval()
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7)
    assert out.abs().max() <= 1


def test_resnet18_party_refuses_flat_features():
    with pytest.raises(ValueError, match=r"party=resnet18 needs image slices of shape \(C, H, W\)"):
        ResNet18Encoder((64,))


def test_split_resnet18_is_resnet18_cut_after_its_first_conv():
    """Stem (3x3 conv, no bias) + body (BN, stages, FC) has exactly ResNet-18's parameters."""
    with torch.device("meta"):
        stem = ResNet18Stem((3, 32, 16))
        body = ResNet18Body(2 * stem.embedding_dim, num_classes=10)
    assert stem.embedding_dim == 64 * 32 * 16
    assert count(stem) == conv(3, 64)
    assert count(body) == bn(64) + resnet18_stages() + linear(512, 10)
    assert count(stem) + count(body) == 11_173_962


def test_split_resnet18_body_reassembles_side_by_side_slices():
    """The body's input map is the parties' conv outputs placed left to right (any widths)."""
    torch.manual_seed(0)
    image = torch.randn(2, 3, 8, 11)
    left, right = image[..., :6], image[..., 6:]
    stems = [ResNet18Stem((3, 8, 6), channels=4), ResNet18Stem((3, 8, 5), channels=4)]
    fused = torch.cat([stems[0](left), stems[1](right)], dim=1)
    body = ResNet18Body(fused.shape[1], num_classes=3, channels=4, height=8)
    seen = []
    body.net.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    assert body(fused).shape == (2, 3)
    expected = torch.cat([stems[0].conv(left), stems[1].conv(right)], dim=3)
    assert torch.equal(seen[0], expected)


@pytest.mark.parametrize(
    ("build", "width"),
    [
        (lambda: ResNet18Body(4 * 4 * 3, 5, channels=4, height=4), 48),
        (lambda: VGG13Head(16, 5), 16),
        (lambda: CreditServerHead(6, 5, hidden=[8, 4]), 6),
    ],
)
def test_heads_take_stacked_batches(build, width):
    """A zeroth-order query evaluates the head on (K, B, in) stacked batches: each of the K
    batches gives what the head gives on it alone, in training mode too (its own batch-norm
    statistics, not those of all K batches together)."""
    torch.manual_seed(0)
    head = build()
    stacked = torch.randn(3, 4, width)
    for mode in (head.train, head.eval):
        mode()
        out = head(stacked)
        assert out.shape == (3, 4, 5)
        for k in range(3):
            torch.testing.assert_close(out[k], head(stacked[k]))


def test_zeroth_order_evaluation_leaves_batch_norm_statistics_alone():
    """The server's query losses and a client's perturbed forwards run the model in training
    mode on copies of its buffers: the running statistics do not move."""
    from vfl_lightning.algorithms.zoo import double_parameters, evaluate_at, perturbed_outputs

    torch.manual_seed(0)
    head = CreditServerHead(6, 3, hidden=[8, 4])
    party = CreditServerHead(5, 3, hidden=[4, 4])  # any model with batch norm
    before = [b.clone() for b in (*head.buffers(), *party.buffers())]
    logits = evaluate_at(head, double_parameters(head), torch.randn(2, 5, 6, dtype=torch.float64))
    assert logits.shape == (2, 5, 3) and logits.dtype == torch.float64
    flat = torch.cat([p.detach().double().reshape(-1) for p in party.parameters()])
    outputs = perturbed_outputs(party, torch.stack([flat, flat + 1e-3]), torch.randn(4, 5))
    assert outputs.shape == (2, 4, 3)
    after = [*head.buffers(), *party.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_split_resnet18_body_refuses_a_width_it_cannot_read():
    with pytest.raises(ValueError, match=r"fused width must be a multiple of 2048, got 1000"):
        ResNet18Body(1000, num_classes=10)


def test_vgg13_counts_match_the_imagenet_vgg13():
    """Configuration B's ten convolutions (3x3, with bias) hold 9,404,992 parameters; with the
    ImageNet classifier (7x7 pooling, FC 4096, 4096, 1000) the total is the 133,047,848 published
    for torchvision's vgg13. Built on the meta device (no memory)."""
    widths = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256)]
    widths += [(256, 512), (512, 512), (512, 512), (512, 512)]
    features = sum(conv(i, o, bias=True) for i, o in widths)
    classifier = linear(512 * 7 * 7, 4096) + linear(4096, 4096) + linear(4096, 1000)
    assert features + classifier == 133_047_848
    with torch.device("meta"):
        model = VGG13Head(3 * 224 * 224, 1000, channels=3, hidden=[4096, 4096], pooled_size=7)
    assert count(model.features) == features
    assert count(model) == 133_047_848


def test_vgg13_server_reads_the_fused_embedding_as_an_image():
    model = VGG13Head(784, num_classes=10)  # Fashion-MNIST's 28 x 28, one channel
    first = conv(1, 64, bias=True) - conv(3, 64, bias=True)
    assert count(model) == 9_404_992 + first + linear(512, 10)
    assert model(torch.randn(4, 784)).shape == (4, 10)
    assert VGG13Head(2 * 5 * 5, 3, channels=2)(torch.randn(2, 50)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"its width must be 1 \* s\^2, got 1000"):
        VGG13Head(1000, num_classes=10)


def test_fedbcd_cnn_counts_and_shape():
    """Two 3x3 convs of 64 channels (same padding) and FC 256 on a 28 x 14 MNIST half."""
    model = FedBCDCNN((1, 28, 14))
    by_hand = conv(1, 64, bias=True) + conv(64, 64, bias=True) + linear(64 * 28 * 14, 256)
    assert count(model) == by_hand == 6_460_352
    out = model(torch.randn(2, 1, 28, 14))
    assert out.shape == (2, 256)
    assert out.min() >= 0  # ReLU on the 256 units


def test_credit_server_layers_and_count():
    model = CreditServerHead(16, 2, hidden=[64, 32])
    kinds = [type(layer).__name__ for layer in model]
    assert kinds == ["Linear", "BatchNorm1d", "Linear", "ReLU", "BatchNorm1d", "WeightNormLinear"]
    by_hand = linear(16, 64) + bn(64) + linear(64, 32) + bn(32) + linear(32, 2) + 2  # + scales
    assert count(model) == by_hand
    assert model(torch.randn(5, 16)).shape == (5, 2)
    with pytest.raises(ValueError, match=r"head.hidden \(two widths\) must be 2 integers"):
        CreditServerHead(16, 2, hidden=[64])


def test_weight_norm_linear_starts_as_linear_and_ignores_the_direction_scale():
    torch.manual_seed(3)
    reference = nn.Linear(6, 4)
    torch.manual_seed(3)
    layer = WeightNormLinear(6, 4)
    x = torch.randn(5, 6)
    torch.testing.assert_close(layer(x), reference(x))
    with torch.no_grad():
        layer.direction.mul_(torch.tensor([[2.0], [0.5], [3.0], [7.0]]))
    torch.testing.assert_close(layer(x), reference(x))  # only the direction of each row counts
    layer(x).sum().backward()
    assert layer.scale.grad is not None and layer.direction.grad is not None


def layer_types(module: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in module.modules())


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_depth_knob_sets_the_number_of_layers(depth):
    mlp = MLPEncoder((10,), embedding_dim=4, hidden=[8], num_layers=depth)
    assert layer_types(mlp, nn.Linear) == depth
    cnn = CNNEncoder((1, 6, 6), embedding_dim=4, channels=[5], num_layers=depth)
    assert layer_types(cnn, nn.Conv2d) == depth
    pn = PolynomialNetwork((10,), embedding_dim=4, num_layers=depth)
    assert pn.degree == depth and pn.weight.shape == (depth * 10 + 1, 4)
    x = torch.randn(3, 1, 6, 6)
    assert mlp(x.reshape(3, -1)[:, :10]).shape == cnn(x).shape == (3, 4)


def test_depth_knob_default_is_the_listed_widths():
    """num_layers matching the listed widths builds the same model, parameter for parameter."""
    for build in (
        lambda **k: MLPEncoder((10,), hidden=[64], **k),
        lambda **k: CNNEncoder((1, 6, 6), channels=[16, 32], **k),
    ):
        torch.manual_seed(0)
        default = build()
        torch.manual_seed(0)
        explicit = build(num_layers=2)
        assert [n for n, _ in default.named_parameters()] == [
            n for n, _ in explicit.named_parameters()
        ]
        for a, b in zip(default.parameters(), explicit.parameters(), strict=True):
            assert torch.equal(a, b)
    mlp = MLPEncoder((10,), hidden=[64, 32], num_layers=4)
    assert [layer.out_features for layer in mlp.net if isinstance(layer, nn.Linear)] == [
        64,
        32,
        32,
        16,
    ]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: MLPEncoder((4,), num_layers=0),
            r"party.num_layers must be an integer >= 1, got 0",
        ),
        (lambda: CNNEncoder((1, 4, 4), num_layers=True), r"party.num_layers must be .*got True"),
        (lambda: PolynomialNetwork((4,), num_layers=-1), r"party.num_layers must be .*got -1"),
        (
            lambda: MLPEncoder((4,), hidden=[], num_layers=2),
            r"party.hidden must name at least one width for party.num_layers=2",
        ),
        (lambda: CNNEncoder((1, 4, 4), channels=[]), r"party.channels must name at least one"),
    ],
)
def test_depth_knob_refuses_bad_values(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("name", "model_type"),
    [
        ("party/resnet18", ResNet18Encoder),
        ("party/fedbcd_cnn", FedBCDCNN),
        ("party/resnet18_stem", ResNet18Stem),
        ("head/resnet18_body", ResNet18Body),
        ("head/vgg13", VGG13Head),
        ("head/credit_server", CreditServerHead),
    ],
)
def test_configs_select_the_models(name, model_type):
    factory = instantiate(OmegaConf.load(Path(CONF_DIR) / f"{name}.yaml"))
    if name.startswith("party/"):
        party = factory(input_shape=(3, 32, 16))
        assert type(party) is model_type
        assert party(torch.randn(2, 3, 32, 16)).shape == (2, party.embedding_dim)
        return
    width = {ResNet18Body: 2 * 64 * 32 * 16, VGG13Head: 784}.get(model_type, 16)
    head = factory(in_features=width, num_classes=10).eval()
    assert type(head) is model_type
    assert head(torch.randn(2, width)).shape == (2, 10)


TINY_RUN = [
    "seed=0",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "data.batch_size=8",
    "data.eval_batch_size=8",
    "callbacks.checkpoint=null",
]


@pytest.mark.parametrize(
    "overrides",
    [
        # the cascaded paper's split: two halves of each (8 x 8 digits) image, concatenated maps
        [
            "algo=splitnn",
            "party=resnet18_stem",
            "head=resnet18_body",
            "head.height=8",
            "data.partition=halves",
            "data.num_parties=2",
        ],
        # FedVS Fig. 1's max fusion into a VGG13 server (a 4 x 4 embedding image)
        ["algo=npq", "mechanism.fusion=max", "party=cnn", "head=vgg13"],
        ["algo=fedbcd", "party=fedbcd_cnn", "party.embedding_dim=8", "head=credit_server"],
        # four ResNet-18 parties (45M parameters): about 10 s on a 2-core machine
        pytest.param(["algo=pbm", "party=resnet18"], marks=pytest.mark.slow),
        # the split under the cascaded paper's algorithm (zeroth-order clients): about 10 s
        pytest.param(
            [
                "algo=cascade",
                "party=resnet18_stem",
                "head=resnet18_body",
                "head.height=8",
                "data.partition=halves",
                "data.num_parties=2",
            ],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["split_resnet18", "max_vgg13", "fedbcd_cnn_credit", "pbm_resnet18", "cascade_split"],
)
def test_papers_models_train(tmp_path, overrides):
    from vfl_lightning.train import train

    cfg = compose_config(tmp_path, *overrides, *TINY_RUN)
    results = train(cfg)
    assert torch.isfinite(torch.tensor(results["train/loss_epoch"]))
    assert 0 <= results["test/acc"] <= 1
