"""The checkpoint shipped in the package: the trainer's architecture, and it retrieves facts."""

from __future__ import annotations

import random

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.probe import formats as fmt
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.tokenizer import ByteTokenizer
from dsv4bisect.reference.training.train import TrainConfig


def test_the_shipped_checkpoint_is_the_trainers_architecture_and_answers_a_probe_needle() -> None:
    engine = ReferenceEngine.load(EMBEDDED_CHECKPOINT, device="cpu")
    assert engine.config == TrainConfig().model_args()
    rng = random.Random(3)
    filler = [rng.choice(PROBE_VOCAB.filler) for _ in range(8)]
    right = 0
    for i in range(3):  # probe vocabulary: never seen in training
        key, code = PROBE_VOCAB.keys[i], fmt.draw_code(rng, PROBE_VOCAB)
        messages = [{"role": "user", "content": " ".join(filler[:4] + [fmt.fact_text(key, code)]
                                                         + filler[4:])},
                    {"role": "assistant", "content": fmt.ACK},
                    {"role": "user", "content": " ".join(filler[2:6])},
                    {"role": "assistant", "content": fmt.ACK},
                    {"role": "user", "content": fmt.code_question([key])}]
        gen = engine.generate(apply_chat_template(messages, True), max_new_tokens=12)
        answer = ByteTokenizer().decode([t for t in gen.output_ids
                                         if t != engine.config.eos_token_id])
        right += answer.strip() == code
    assert right == 3, right
