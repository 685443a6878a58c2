"""CPU: SmolLM2 draft, a few dozen steps per variant, eval loss on the target's argmax labels (held-out rows).

    python benchmarks/results/lease_2026-12-02_session6/cpu_feature_experiment.py STEPS   # writes /tmp/exp/
"""

import itertools
import json
import random
import sys
import time

import torch
import transformers

from transformers_longspec import LongSpecDraft
from transformers_longspec.demo import load_smollm2
from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator
from transformers_longspec.trainers.corpus import corpus_documents
from transformers_longspec.trainers.data import pack_texts

VARIANTS = [
    ("init+feature", {"target_hidden_input": True}),
    ("init", {}),
    ("noinit+feature", {"target_hidden_input": True, "init_from_target": False}),
    ("noinit", {"init_from_target": False}),
]

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
target, tok = load_smollm2()
docs = []
for kind, n in [("python", 60), ("c_cpp", 40), ("docs", 40)]:
    docs += list(itertools.islice(corpus_documents(kind, min_chars=2000, max_chars=20000, seed=3), n))
random.Random(0).shuffle(docs)
rows = pack_texts(docs, tok, 512, 400)
train, held = rows[:-8], rows[-8:]
print("rows", len(train), len(held), flush=True)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
out = {}
for name, kw in VARIANTS:
    args = LongSpecTrainingArguments(
        output_dir="/tmp/exp/o", use_cpu=True, report_to=[], disable_tqdm=True, max_steps=steps,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=1e-3, lr_scheduler_type="cosine",
        warmup_steps=0.05, weight_decay=0.1, adam_beta2=0.95, logging_steps=10, save_strategy="no", seed=0,
        distill_labels=True, soft_labels_topk=16, soft_labels_weight=0.5, anchor_max_length=2048,
        dataloader_num_workers=0)
    draft = LongSpecDraft.from_target(target, **kw).float()
    trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=train, eval_dataset=held,
                              data_collator=TokenCollator(pad_token_id=tok.pad_token_id or 0))
    start = time.time()
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    curve = [round(h["loss"], 2) for h in trainer.state.log_history if "loss" in h]
    out[name] = {"before": round(before, 3), "after": round(after, 3), "curve": curve, "s": round(time.time() - start)}
    print(name, out[name], flush=True)
json.dump(out, open("/tmp/exp/smol_levers.json", "w"), indent=1)
