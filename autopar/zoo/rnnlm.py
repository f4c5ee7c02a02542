"""PaSE's RNN language model (docs/pase.md §7.2): embedding, a 2-layer LSTM, a vocabulary FC.

PaSE's sizes (vocabulary 100000, 2048 units, sequence 256) are the defaults; the output FC alone
is 205M parameters, so plan it on ``device="meta"``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNLM(nn.Module):
    def __init__(self, vocab: int, units: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, units)
        self.lstm = nn.LSTM(units, units, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(units, vocab)

    def forward(self, tokens, labels=None):
        x, _ = self.lstm(self.embed(tokens))
        logits = self.fc(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def rnnlm(batch=64, seq=256, vocab=100000, units=2048, layers=2, device="cpu", seed=0):
    torch.manual_seed(seed)
    with torch.device(device):
        model = RNNLM(vocab, units, layers)
        tokens = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (tokens, labels)
