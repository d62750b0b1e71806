"""Small command-recording helpers (barriers, image layout changes) shared by tensors and programs.

Kept apart so that the synchronisation rules live in one place: compute and transfer work is
ordered with global memory barriers (every image stays in VK_IMAGE_LAYOUT_GENERAL), and the host
sees device writes only after a barrier to the HOST stage.
"""
from __future__ import annotations


def stages(vk):
    """Commonly combined stage and access masks."""
    return {
        "work": vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
        "writes": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
        "all": (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
                | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT),
    }


def barrier(vk, cmd, src_stage: int, src_access: int, dst_stage: int, dst_access: int) -> None:
    """One global memory barrier (covers buffers and GENERAL-layout images alike)."""
    mb = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=src_access,
                            dstAccessMask=dst_access)
    vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)


def work_to_work(vk, cmd) -> None:
    """Make earlier compute/transfer writes visible to later compute/transfer work."""
    s = stages(vk)
    barrier(vk, cmd, s["work"], s["writes"], s["work"], s["all"])


def host_to_work(vk, cmd) -> None:
    """Order host writes (made visible by the submit) before device work, for clarity and WAR."""
    s = stages(vk)
    barrier(vk, cmd, vk.VK_PIPELINE_STAGE_HOST_BIT | s["work"], vk.VK_ACCESS_HOST_WRITE_BIT | s["writes"],
            s["work"], s["all"])


def work_to_host(vk, cmd) -> None:
    """Make device writes visible to host reads of mapped memory after the fence."""
    s = stages(vk)
    barrier(vk, cmd, s["work"], s["writes"], vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)


def work_to_work_discarding(vk, cmd, images, *, memory: bool = True) -> None:
    """One barrier doing both jobs a program needs before a dispatch: the global work_to_work
    barrier (when `memory`) and the discarding move of `images` to GENERAL (image_to_general),
    instead of one vkCmdPipelineBarrier each."""
    s = stages(vk)
    rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                     baseArrayLayer=0, layerCount=1)
    ibs = [vk.VkImageMemoryBarrier(
        sType=vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, srcAccessMask=s["all"], dstAccessMask=s["all"],
        oldLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED, newLayout=vk.VK_IMAGE_LAYOUT_GENERAL,
        srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
        image=image, subresourceRange=rng) for image in images]
    mbs = [vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=s["writes"],
                              dstAccessMask=s["all"])] if memory else []
    vk.vkCmdPipelineBarrier(cmd, s["work"], s["work"], 0, len(mbs), mbs or None, 0, None, len(ibs), ibs or None)


def image_to_general(vk, cmd, image, *, discard: bool) -> None:
    """Move a colour image to GENERAL; `discard` starts from UNDEFINED (contents not kept).

    Used once after creation, and inside programs before the first write of an image whose
    memory is shared with other intermediates (its old contents belong to another tensor).
    """
    s = stages(vk)
    rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                     baseArrayLayer=0, layerCount=1)
    ib = vk.VkImageMemoryBarrier(
        sType=vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, srcAccessMask=s["all"], dstAccessMask=s["all"],
        oldLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED if discard else vk.VK_IMAGE_LAYOUT_GENERAL,
        newLayout=vk.VK_IMAGE_LAYOUT_GENERAL, srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
        dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, image=image, subresourceRange=rng)
    vk.vkCmdPipelineBarrier(cmd, s["work"], s["work"], 0, 0, None, 0, None, 1, [ib])
