"""The cost-to-target tracker sees each epoch's own train metrics (the module logs them after the
epoch's last batch, before callbacks' on_train_epoch_end), so a train-metric target is recorded
at the epoch that reached it."""

from vfl_lightning.train import train


def test_train_metric_target_is_recorded_at_the_epoch_that_reached_it(make_cfg):
    cfg = make_cfg(
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "target.metric=train/acc",
        "target.value=0.0",
        "test=false",
    )
    results = train(cfg)
    # every accuracy is >= 0: the target is reached by the first epoch's own train/acc
    assert results["epoch_to_target"] == 0
    assert results["rounds_to_target"] == 3
