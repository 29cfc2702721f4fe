namespace fsdplab {}
