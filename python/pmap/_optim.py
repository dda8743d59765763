"""Optimizer settings (pmap_optimizer): pmap.sgd, pmap.adam and pmap.adamw, each taking the keywords
of its own update only. A keyword of another optimizer (adam(momentum=0.9)) is refused naming it,
where it would otherwise be ignored."""
from ._convert import INT64, choice, flag, integer, real
from ._lib import ArgumentTypeError, Optimizer

_KINDS = {"sgd": 0, "adam": 1, "adamw": 2}
_SCHEDULES = {"constant": 0, "warmup_cosine": 1, "warmup_linear": 2}

# Every optimizer: clipping and the learning-rate schedule (docs/models.md, "Optimizers").
_COMMON = {"clip_norm": 0.0, "schedule": "constant", "warmup_steps": 0, "decay_steps": 0,
           "final_lr": 0.0}
_OWN = {
    "sgd": {"momentum": 0.0, "nesterov": False, "weight_decay": 0.0},
    "adam": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
    "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}
# Why a keyword of another optimizer does not apply, for the message.
_ELSEWHERE = {
    ("adam", "weight_decay"): "Adam's update has no weight decay; pmap.adamw(lr, weight_decay=...) "
                              "decays the weights decoupled from the gradient",
    ("adam", "momentum"): "Adam's momentum is beta1",
    ("adamw", "momentum"): "AdamW's momentum is beta1",
}


def _settings(kind, lr, given):
    own = _OWN[kind]
    for key in given:
        if key in own or key in _COMMON:
            continue
        why = _ELSEWHERE.get((kind, key))
        if why is None:
            users = [k for k, v in _OWN.items() if key in v]
            why = (f"it is a setting of {' and '.join('pmap.' + u for u in users)}" if users
                   else "no optimizer has it")
        accepted = ", ".join(sorted(own) + sorted(_COMMON))
        raise ArgumentTypeError(f"pmap.{kind}: {key} is not one of its settings ({why}); "
                                f"pmap.{kind} takes lr, {accepted}")
    v = dict(_COMMON, **own)
    v.update(given)
    o = Optimizer()
    o.kind = _KINDS[kind]
    o.lr = real("lr", lr)
    o.momentum = real("momentum", v.get("momentum", 0.0))
    o.nesterov = flag("nesterov", v.get("nesterov", False))
    o.weight_decay = real("weight_decay", v.get("weight_decay", 0.0))
    o.beta1, o.beta2 = real("beta1", v.get("beta1", 0.0)), real("beta2", v.get("beta2", 0.0))
    o.eps = real("eps", v.get("eps", 0.0))
    o.clip_norm = real("clip_norm", v["clip_norm"])
    o.schedule = choice("schedule", v["schedule"], _SCHEDULES)
    o.warmup_steps = integer("warmup_steps", v["warmup_steps"], *INT64)
    o.decay_steps = integer("decay_steps", v["decay_steps"], *INT64)
    o.final_lr = real("final_lr", v["final_lr"])
    return o


def sgd(lr, momentum=0.0, **settings):
    """SGD settings (pmap_sgd): momentum, and the keywords nesterov, weight_decay (added to the
    gradient), clip_norm, schedule ("constant", "warmup_cosine", "warmup_linear"), warmup_steps,
    decay_steps, final_lr. The settings are a plain value: copy and pickle it."""
    return _settings("sgd", lr, dict(settings, momentum=momentum))


def adam(lr, **settings):
    """Adam settings (pmap_adam): beta1 0.9, beta2 0.999, eps 1e-8 unless given; clip_norm and
    the schedule keywords as for sgd. No weight decay: that is adamw."""
    return _settings("adam", lr, settings)


def adamw(lr, weight_decay=0.01, **settings):
    """AdamW settings (pmap_adamw): Adam's keywords, and weight_decay decoupled from the
    gradient."""
    return _settings("adamw", lr, dict(settings, weight_decay=weight_decay))
