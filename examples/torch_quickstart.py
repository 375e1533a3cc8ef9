"""The README's PyTorch example: fused AdamW on a small model, an LR scheduler, and a state
dict that torch.optim.AdamW loads; then (docs/python.md) a torch optimizer and its scheduler
moved to fusedopt mid-training. Run by python/tests (test_the_quickstart_runs).

  python3 examples/torch_quickstart.py      (writes opt.pt in the current folder)
"""
# docs:begin quickstart
import torch
import fusedopt.torch as ft

torch.manual_seed(0)
model = torch.nn.Linear(64, 1)
x = torch.randn(256, 64)
y = x @ torch.randn(64, 1)  # a target the model can fit
opt = ft.Optimizer(model.parameters(), rule="adamw", lr=5e-2, betas=(0.9, 0.999))
# ... or any rule: ft.Optimizer(params, rule=open("my_momentum.rule").read(), lr=1e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200)
for step in range(200):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()  # one fused launch over every param with a grad (torch's current stream)
    sched.step()  # changes group["lr"]: the next step uses it, nothing recompiles
print(opt.stats()[0]["fusion_report"])
torch.save(opt.state_dict(), "opt.pt")
torch.optim.AdamW(model.parameters()).load_state_dict(opt.state_dict())  # torch's layout
# docs:end quickstart
print(f"loss {loss.item():.6f}")

# docs:begin from_torch
# A torch optimizer and its LR scheduler, moved to fusedopt in the middle of training.
torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch_sched = torch.optim.lr_scheduler.StepLR(torch_opt, step_size=10, gamma=0.5)
for step in range(30):
    if step == 10:
        opt = ft.from_torch(torch_opt)  # the same params, groups, hypers and state (its step)
        torch_sched.optimizer = opt  # the scheduler now sets fusedopt's group["lr"]
    current = torch_opt if step < 10 else opt
    current.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    current.step()
    torch_sched.step()
print(f"lr after the move: {opt.param_groups[0]['lr']:.6g}")  # 1e-2 halved 3 times
# docs:end from_torch
