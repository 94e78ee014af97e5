"""Which "Process N has X GiB" entries of PyTorch's out-of-memory message are other programs: an entry holding more
than the card's used memory leaves beside what PyTorch reserved is the trainer itself, and NVML's not-available
value (printed as 17179869184.00 GiB under WSL and Windows) is no reading of anyone's memory."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse.oomfigures import oom_figures


def _message(total, free, processes, allocated, reserved_unalloc, this_process=None):
    listed = " ".join(f"Process {pid} has {g:.2f} GiB memory in use." for pid, g in processes)
    own = (f" Including non-PyTorch memory, this process has {this_process:.2f} GiB memory in use."
           if this_process is not None else "")
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.08 GiB. GPU 0 has a total capacity of "
            f"{total:.2f} GiB of which {free:.2f} GiB is free. {listed}{own} Of the allocated memory {allocated:.2f} "
            f"GiB is allocated by PyTorch, and {reserved_unalloc:.2f} GiB is reserved by PyTorch but unallocated.")


@pytest.mark.parametrize("total, free, held, allocated", [
    (79.11, 6.68, 72.39, 64.08),   # 8 GiB outside PyTorch's allocator, more than a context explains
    (24.00, 0.50, 23.40, 15.00),
    (12.00, 0.00, 11.90, 6.00),
])
def test_a_lone_entry_holding_more_than_the_others_could_is_the_trainer(total, free, held, allocated):
    f = oom_figures(_message(total, free, [(4242, held)], allocated, 0.09))
    assert f.trainer_pid == 4242 and f.process_in_use_gib == pytest.approx(held)
    assert f.other_processes == ()


@pytest.mark.parametrize("total, free, held, allocated", [
    (24.00, 0.50, 8.00, 15.00),    # 15 GiB of PyTorch's plus 8 GiB elsewhere: the card's 23.5 GiB in use
    (12.00, 0.00, 5.50, 6.00),
])
def test_an_entry_that_fits_beside_the_trainer_stays_another_program(total, free, held, allocated):
    f = oom_figures(_message(total, free, [(4242, held)], allocated, 0.09))
    assert f.trainer_pid is None and f.other_processes == ((4242, pytest.approx(held)),)


def test_two_entries_too_large_for_others_name_no_trainer():
    # Figures that cannot all be true (two entries each above what others could hold) decide nothing.
    f = oom_figures(_message(24.0, 0.5, [(1, 20.0), (2, 21.0)], 15.0, 0.1))
    assert f.trainer_pid is None and len(f.other_processes) == 2


def test_an_entry_that_is_reserved_memory_plus_a_context_is_still_the_trainer():
    f = oom_figures(_message(24.0, 0.5, [(7, 3.0), (9, 20.4)], 19.8, 0.2))
    assert f.trainer_pid == 9 and f.other_processes == ((7, 3.0),)


@pytest.mark.parametrize("this_process", [17179869184.0, None])
def test_nvmls_not_available_value_is_no_other_program(this_process):
    f = oom_figures(_message(12.0, 0.0, [(162525, 17179869184.0)], 17.76, 0.31, this_process))
    assert f.other_processes == ()


def test_a_real_large_figure_of_another_program_is_kept():
    f = oom_figures(_message(80.0, 0.1, [(3, 40.0)], 39.0, 0.1, this_process=39.5))
    assert f.other_processes == ((3, 40.0),)


def test_diagnose_shows_nvmls_not_available_value_as_no_reading(tmp_path):
    from tests.clihelp import invoke

    log = tmp_path / "wsl.log"
    log.write_text(_message(12.0, 0.0, [(162525, 17179869184.0)], 17.76, 0.31, 17179869184.0) + "\n")
    res = invoke("diagnose", str(log))
    assert res.exit_code == 0, res.output
    assert "no reading (NVML)" in res.stdout and "17179869184" not in res.stdout
    assert "162525" not in res.stdout


@pytest.mark.parametrize("processes", [
    # Eight ranks of one job on one card, each holding about what this process reserved plus a context.
    [(280468, 5.57), (280474, 5.35), (280470, 5.53), (280467, 5.57), (280473, 5.75), (280472, 5.49),
     (280469, 5.65), (280471, 5.57)],
    [(11, 5.4), (12, 5.9)],
])
def test_several_entries_that_each_fit_the_trainer_name_none(processes):
    f = oom_figures(_message(44.52, 0.002, processes, 4.92, 0.13))
    assert f.trainer_pid is None and f.process_in_use_gib is None
    assert [pid for pid, _ in f.other_processes] == [pid for pid, _ in processes]


def test_one_fitting_entry_among_others_that_do_not_is_the_trainer():
    f = oom_figures(_message(44.52, 0.002, [(1, 5.4), (2, 20.0), (3, 12.0)], 4.92, 0.13))
    assert f.trainer_pid == 1 and [pid for pid, _ in f.other_processes] == [2, 3]
