"""`benchmarks/explore/spill_profile.py` reads ncu's source page as exported and charges each local load's wait to
the first instruction that reads its register."""
from __future__ import annotations

import gzip

from benchmarks.explore.spill_profile import _operands, profile, read_rows

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier",'
          '"stall_long_sb"')


def _export(tmp_path, rows: list[str]):
    path = tmp_path / "source.csv.gz"
    path.write_bytes(gzip.compress("\n".join(['"Kernel Name","batch_chain",', HEADER, *rows]).encode()))
    return read_rows(path)


def test_a_load_s_wait_is_charged_to_its_first_reader(tmp_path):
    rows = _export(tmp_path, [
        '"0x7f0000001000","LDL R94, [R1+0xf0] ;","1","528","0","0"',
        '"0x7f0000001010","IADD3 R5, R6, R7, RZ ;","2","528","0","1"',      # (not a reader)
        '"0x7f0000001020","@!P0 STL [R1+0x10], R94 ;","30","528","0","25"',  # the first reader: a store's source
        '"0x7f0000001030","LDL.64 R20, [R1+0x8] ;","0","1,056","0","0"',
        '"0x7f0000001040","MOV R21, 0x1 ;","0","1,056","0","7"',            # R21 written first: no reader
        '"0x7f0000001050","BAR.SYNC.DEFER_BLOCKING 0x0 ;","500","528","500","0"',
    ])
    table = {0x00: ("attention.py", 10, ""), 0x10: ("attention.py", 11, ""), 0x20: ("linear.py", 90, ""),
             0x30: ("batch.py", 846, ""), 0x40: ("batch.py", 847, ""), 0x50: ("batch.py", 903, "")}
    found = profile(rows, table)
    assert found["executed"] == {("attention.py", 10): 528, ("linear.py", 90): 528, ("batch.py", 846): 1056}
    assert found["waits"] == {("linear.py", 90): 25}
    assert (found["samples"], found["active"]) == (533, 33)


def test_operands_know_which_instructions_write_nothing():
    assert _operands("LDL.64 R20, [R1+0x8] ;") == ({20, 21}, {1})
    assert _operands("STL [R1+0x10], R94 ;") == (set(), {1, 94})
    assert _operands("@P1 FFMA R3, R4, R5, R3 ;") == ({3}, {3, 4, 5})
    assert _operands("RED.E.ADD.F64.RN.STRONG.GPU [R2.64], R8 ;") == (set(), {2, 8})
